/* A real server as a zygote: its initialised process forks a fresh server on request.
 *
 * A fuzz campaign restarts the server it fuzzes after every crash it finds; p7 aborts on
 * every tensor outside its buffer, so a sweep restarts it ten thousand times, and each start
 * (exec, dynamic loading, backend initialisation) costs more than the case that killed it.
 * AFL's fork server pays that once; this does the same at the grain of a whole server: the
 * process starts as usual, and at its first bind() of a TCP socket (backends initialised,
 * the listening socket created but not bound) it becomes a zygote that never serves. On each
 * request it forks a child that returns from that bind() and goes on as the server would
 * have: binds, listens, accepts. A crash kills one child; the next is a fork away. Each child
 * binds a socket of its own (the zygote's stays unbound), so a dead child's port refuses
 * connections exactly as a dead process's does.
 *
 * Enabled by HARNESS_ZYGOTE_FD=<fd>, one end of a SOCK_SEQPACKET socketpair the harness
 * holds (one message per write: the zygote and a child may both speak):
 *   harness -> zygote: "f"                 fork a child
 *   zygote -> harness: "R"                 the zygote point is reached
 *                      "P <pid>"           a child was forked
 *                      "X <pid> <status>"  a child ended (wait status; the zygote reaps)
 *   child  -> harness: "L <pid> <rc> <errno>"  its listen() returned
 * When the harness's end closes, the zygote kills its children and exits; a child dies
 * with the zygote (PR_SET_PDEATHSIG). Without the variable the shim does nothing. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

enum { WAITING, ZYGOTE_CHILD, OFF };
static int state = WAITING;
static int ctl = -1;          /* the control socket; in a child, until its listen() */
static int listen_fd = -1;    /* the socket the server binds and listens on */
static int sig_pipe[2] = {-1, -1};

static void say(const char *text) {
    while (send(ctl, text, strlen(text), MSG_NOSIGNAL) < 0) {
        if (errno != EINTR) _exit(3);  /* the harness is gone */
    }
}

static void on_child(int sig) {
    (void)sig;
    int saved = errno;
    (void)!write(sig_pipe[1], "c", 1);
    errno = saved;
}

static void reap(void) {
    int status;
    pid_t pid;
    char line[64];
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        snprintf(line, sizeof line, "X %d %d", (int)pid, status);
        say(line);
    }
}

/* The child's own listening socket, made like the zygote's: same family, type and protocol,
 * the options a server sets before bind, and the same descriptor number. */
static void fresh_socket(void) {
    int domain = 0, type = 0, protocol = 0, reuse = 0, nodelay = 0;
    socklen_t l = sizeof domain;
    getsockopt(listen_fd, SOL_SOCKET, SO_DOMAIN, &domain, &l);
    l = sizeof type;
    getsockopt(listen_fd, SOL_SOCKET, SO_TYPE, &type, &l);
    l = sizeof protocol;
    getsockopt(listen_fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &l);
    l = sizeof reuse;
    getsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &reuse, &l);
    l = sizeof nodelay;
    getsockopt(listen_fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &l);
    int s = socket(domain, type, protocol);
    if (s < 0) _exit(3);
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof reuse);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &nodelay, sizeof nodelay);
    if (dup2(s, listen_fd) < 0) _exit(3);
    close(s);
}

/* The zygote's loop; returns only in a forked child. */
static void zygote(void) {
    fflush(NULL);  /* the banner: written once, not once per child at its exit */
    if (pipe2(sig_pipe, O_CLOEXEC) != 0) _exit(3);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_child;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    pid_t self = getpid();
    say("R");
    for (;;) {
        struct pollfd fds[2] = {{ctl, POLLIN, 0}, {sig_pipe[0], POLLIN, 0}};
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            _exit(3);
        }
        if (fds[1].revents & POLLIN) {
            char buf[64];
            (void)!read(sig_pipe[0], buf, sizeof buf);
            reap();
        }
        if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char cmd[8];
        ssize_t n = recv(ctl, cmd, sizeof cmd, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {  /* the harness is gone, and so are we */
            signal(SIGTERM, SIG_IGN);
            kill(0, SIGKILL);
            _exit(0);
        }
        if (cmd[0] != 'f') continue;
        pid_t pid = fork();
        if (pid < 0) _exit(3);
        if (pid == 0) {  /* a server now, no longer a zygote */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != self) _exit(3);  /* the zygote died before the line above */
            signal(SIGCHLD, SIG_DFL);
            close(sig_pipe[0]);
            close(sig_pipe[1]);
            fresh_socket();
            state = ZYGOTE_CHILD;
            return;
        }
        char line[32];
        snprintf(line, sizeof line, "P %d", (int)pid);
        say(line);
    }
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real_bind)(int, const struct sockaddr *, socklen_t);
    if (!real_bind) real_bind = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
    if (state == WAITING && addr && (addr->sa_family == AF_INET || addr->sa_family == AF_INET6)) {
        int type = 0;
        socklen_t tl = sizeof type;
        const char *v = getenv("HARNESS_ZYGOTE_FD");
        if (!v || !*v) {
            state = OFF;
        } else if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_STREAM) {
            ctl = atoi(v);
            unsetenv("HARNESS_ZYGOTE_FD");
            listen_fd = fd;
            zygote();
        }
    }
    return real_bind(fd, addr, len);
}

int listen(int fd, int backlog) {
    static int (*real_listen)(int, int);
    if (!real_listen) real_listen = (int (*)(int, int))dlsym(RTLD_NEXT, "listen");
    int rc = real_listen(fd, backlog);
    if (state == ZYGOTE_CHILD && fd == listen_fd && ctl >= 0) {
        int saved = errno;
        char line[48];
        snprintf(line, sizeof line, "L %d %d %d", (int)getpid(), rc, rc ? saved : 0);
        say(line);
        close(ctl);
        ctl = -1;
        errno = saved;
    }
    return rc;
}

// A fuzzing-engine stand-in for coverage builds: runs every input given (files, or the files
// of directories) once through LLVMFuzzerTestOneInput, each in a forked child, so an input
// that aborts (a GGML_ASSERT) or faults still counts: the child writes its coverage profile
// from the signal handler before it dies. Link it as $LIB_FUZZING_ENGINE with
// -fprofile-instr-generate -fcoverage-mapping and run with LLVM_PROFILE_FILE=...%1m.profraw
// (the runtime merges every child's counters into one pool file).

#define _GNU_SOURCE
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int * argc, char *** argv);
__attribute__((weak)) int __llvm_profile_write_file(void);

static unsigned g_timeout = 10;  // seconds per input (HARNESS_REPLAY_TIMEOUT)

static void write_profile_and_exit(int sig) {
    if (__llvm_profile_write_file) {
        __llvm_profile_write_file();
    }
    _exit(128 + sig);
}

static int run_one(const char * path) {
    FILE * f = fopen(path, "rb");
    if (!f) {
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t * buf = malloc(n > 0 ? (size_t)n : 1);
    size_t got = n > 0 ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGABRT, write_profile_and_exit);
        signal(SIGSEGV, write_profile_and_exit);
        signal(SIGBUS, write_profile_and_exit);
        signal(SIGFPE, write_profile_and_exit);
        signal(SIGALRM, write_profile_and_exit);
        alarm(g_timeout);
        LLVMFuzzerTestOneInput(buf, got);
        if (__llvm_profile_write_file) {
            __llvm_profile_write_file();
        }
        _exit(0);
    }
    free(buf);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) {
        return -1;
    }
    return status;
}

static void run_path(const char * path, unsigned * runs, unsigned * failed) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        ++*failed;
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        DIR * d = opendir(path);
        struct dirent * e;
        while (d && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') {
                continue;
            }
            char child[4096];
            snprintf(child, sizeof child, "%s/%s", path, e->d_name);
            run_path(child, runs, failed);
        }
        if (d) {
            closedir(d);
        }
        return;
    }
    int status = run_one(path);
    ++*runs;
    if (status != 0) {
        ++*failed;
    }
}

int main(int argc, char ** argv) {
    const char * t = getenv("HARNESS_REPLAY_TIMEOUT");
    if (t && atoi(t) > 0) {
        g_timeout = (unsigned)atoi(t);
    }
    if (LLVMFuzzerInitialize) {
        LLVMFuzzerInitialize(&argc, &argv);
    }
    unsigned runs = 0, failed = 0;
    for (int i = 1; i < argc; ++i) {
        if (argv[i][0] != '-') {
            run_path(argv[i], &runs, &failed);
        }
    }
    printf("replay: %u inputs run, %u ended abnormally\n", runs, failed);
    return 0;
}

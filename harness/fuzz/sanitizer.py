"""Sanitizer and libFuzzer reports, parsed into what identifies a bug.

A process built with ``-fsanitize=address,undefined`` (a sanitizer peer build, or the
in-process libFuzzer target) dies of many different bugs the same way (``exit 1`` or SIGABRT),
so the exit status says little. The report it prints says everything::

    ==123==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x602000000011 ...
    WRITE of size 4 at 0x602000000011 thread T0
        #0 0x55d1 in ggml_vec_set_f32 /src/ggml/src/ggml-cpu/vec.h:51:45
        #1 0x55d2 in rpc_server::set_tensor(...) /src/ggml/src/ggml-rpc/ggml-rpc.cpp:1470:5

:func:`parse` turns such a text (ASan, UBSan ``runtime error``, LeakSanitizer, libFuzzer's
deadly signal / out-of-memory / timeout, with the GGML_ASSERT or ``terminate`` line printed
before it) into a :class:`SanitizerReport`: the tool, the bug type, READ/WRITE and size, and
the first frames in project code (ggml and the server, not the sanitizer runtime, libc,
libstdc++ or the harness). :meth:`SanitizerReport.signature_line` is the part of a finding's
signature that tells a heap-use-after-free, a heap overflow and an assert apart even when all
of them end the process the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

PROJECT_FRAMES = 3  # frames of project code in a signature

_ASAN = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer|ThreadSanitizer|MemorySanitizer): "
                   r"(?P<rest>.*)")
_LIBFUZZER = re.compile(r"ERROR: libFuzzer: (?P<rest>.*)")
# The sanitizer runtime's own RSS bound (``hard_rss_limit_mb``, what the libFuzzer engine uses
# instead of ``-rss_limit_mb``): a report line without "ERROR:".
_HARD_RSS = re.compile(r"==\d+==(?P<tool>\w+Sanitizer): hard rss limit exhausted")
_UBSAN = re.compile(r"^(?P<loc>\S+?):(?P<line>\d+)(?::\d+)?: runtime error: (?P<msg>.*)$")
_ACCESS = re.compile(r"^(?P<op>READ|WRITE) of size (?P<size>\d+) at ")
_SEGV_ACCESS = re.compile(r"The signal is caused by a (?P<op>READ|WRITE) memory access")
_FRAME = re.compile(r"^\s*#(?P<n>\d+) 0x[0-9a-f]+ in (?P<func>.+?)"
                    r"(?: (?P<file>/\S+?|\S+\.(?:c|cc|cpp|h|hpp|inc)):(?P<line>\d+)(?::\d+)?)?"
                    r"(?: \((?P<module>[^)]*)\))?\s*$")
_SUMMARY = re.compile(r"^SUMMARY: (?P<tool>\w+): (?P<text>.*)$")
_ABORT = re.compile(r"(?P<file>\S+\.(?:c|cc|cpp|h)):(?P<line>\d+): (?P<msg>GGML_ASSERT\(.*\) "
                    r"failed|GGML_ABORT.*|.*)$")
_TERMINATE = re.compile(r"terminate called (?:after throwing an instance of '(?P<what>[^']+)'"
                        r"|.*)")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_NUMBER = re.compile(r"\b\d{3,}\b")
_VALUE = re.compile(r"(?<![\w.])-?\d+(?![\w])")  # a number, not the digits of uint64_t

# Frames that are never the bug: the sanitizer and fuzzer runtimes, the C and C++ runtime
# libraries, and the harness's own glue (rpc_server_fuzzer.cpp's transport and entry point).
_RUNTIME_FUNCS = re.compile(r"^(?:__asan|__ubsan|__sanitizer|__interceptor|__interception|"
                            r"___interceptor|__lsan|fuzzer::|LLVMFuzzer|__libc|_start|"
                            r"__GI_|__pthread|abort$|raise$|gsignal$|pthread_kill|malloc$|"
                            r"calloc$|realloc$|free$|operator new|operator delete|memcpy|"
                            r"memmove|memset|memcmp|strlen|__memcpy|__memmove|__memset|"
                            r"std::|__gnu_cxx::|__cxxabiv1::|__cxa_|ggml_abort|"
                            r"ggml_print_backtrace|socket_t::|harness_fuzz::|"
                            r"main$)")
_PROJECT_FILE = re.compile(r"(?:^|/)(?:ggml[^/]*/|src/|include/)|ggml")


_SERVER_METHOD = re.compile(r"^rpc_server::(\w+)\b")


@dataclass(frozen=True)
class Frame:
    func: str
    file: str = ""  # base name
    line: int = 0

    def short(self) -> str:
        """``func (file)``: no line number, so a signature survives unrelated edits."""
        name = re.sub(r"\(.*\)$", "", self.func).strip()  # drop C++ parameter lists
        return f"{name} ({self.file})" if self.file else name


@dataclass
class SanitizerReport:
    tool: str  # AddressSanitizer | UndefinedBehaviorSanitizer | LeakSanitizer | libFuzzer
    bug_type: str  # heap-use-after-free, deadly signal, out-of-memory, timeout, ...
    access: str = ""  # READ | WRITE | ""
    size: int | None = None
    frames: list[Frame] = field(default_factory=list)
    project_frames: list[Frame] = field(default_factory=list)
    abort_line: str = ""  # the GGML_ASSERT / terminate line printed before the report
    summary: str = ""
    text: str = ""  # the report itself, from its first line

    @property
    def kind(self) -> str:
        """The finding kind: resource exhaustion is a memory or hang finding, the rest crashes."""
        if self.bug_type.startswith("out-of-memory"):
            return "memory"
        if self.tool == "libFuzzer" and self.bug_type == "timeout":
            return "hang"
        return "crash"

    @property
    def is_abort(self) -> bool:
        """An assert or uncaught exception: the process aborted on purpose."""
        return bool(self.abort_line)

    def signature_line(self) -> str:
        """What identifies the bug. An abort keeps the abort's own line (so it equals the
        line a live campaign reads from the same server's log); a sanitizer error is its
        class, READ/WRITE and access size (scalar accesses only: a memcpy's size is the
        fuzzed length), and the first project frames."""
        if self.is_abort:
            return self.abort_line
        parts = [f"{self.tool}: {self.bug_type}"]
        if self.access:
            parts.append(self.access)
            if self.size is not None and self.size <= 16:
                parts.append(f"size {self.size}")
        line = " ".join(parts)
        where = " < ".join(f.short() for f in self.project_frames[:PROJECT_FRAMES])
        return f"{line} in {where}" if where else line

    def title(self) -> str:
        return self.signature_line()

    def server_method(self) -> str | None:
        """The innermost ``rpc_server::<method>`` frame of the stack (``graph_compute``,
        ``set_tensor``, ...): the request the server was serving when the report fired, which
        a live replay cannot always tell from the wire (a request without an answer, then the
        next one unanswered because the sanitizer was still printing)."""
        for f in self.frames:
            m = _SERVER_METHOD.match(f.func)
            if m:
                return m.group(1)
        return None


def _base(path: str | None) -> str:
    return PurePosixPath(path).name if path else ""


def _frames(lines: list[str], start: int) -> list[Frame]:
    """The first stack trace at or after ``start`` (``#0 ... #N``, ended by a blank line)."""
    out: list[Frame] = []
    for line in lines[start:]:
        m = _FRAME.match(line)
        if m:
            if m.group("n") == "0" and out:
                break  # a second trace (e.g. where the memory was freed): not the bug's
            out.append(Frame(m.group("func").strip(), _base(m.group("file")),
                             int(m.group("line") or 0)))
        elif out and not line.strip():
            break
    return out


def _is_project(f: Frame) -> bool:
    if _RUNTIME_FUNCS.match(f.func) or f.file in ("", "rpc_server_fuzzer.cpp"):
        return False
    return bool(_PROJECT_FILE.search(f.file)) or f.file.endswith((".c", ".cpp", ".h"))


def _clean_bug_type(text: str) -> str:
    """``heap-use-after-free on address 0x... at pc ...`` -> ``heap-use-after-free``."""
    text = text.split(" on address ")[0].split(" on unknown address ")[0].split(": ")[0]
    text = re.sub(r" \(pc 0x[0-9a-f]+.*$", "", text)
    text = _HEX.sub("0x?", text)
    return _NUMBER.sub("N", text).strip()


def _abort_before(lines: list[str], end: int) -> str:
    """The GGML_ASSERT / GGML_ABORT / terminate line printed before a deadly signal."""
    for line in reversed(lines[max(0, end - 60):end]):
        text = line.strip()
        if "GGML_ASSERT" in text or "GGML_ABORT" in text:
            m = _ABORT.search(text)
            if m:
                return f"{_base(m.group('file'))}:{m.group('line')}: {m.group('msg')}"
        t = _TERMINATE.search(text)
        if t:
            return (f"terminate called after throwing an instance of '{t.group('what')}'"
                    if t.group("what") else t.group(0))
    return ""


def parse(text: str | list[str]) -> SanitizerReport | None:
    """The first sanitizer or libFuzzer error report in ``text`` (a log), or None."""
    lines = text.splitlines() if isinstance(text, str) else list(text)
    # What ended the process comes first: an ASan/LSan error, then libFuzzer's (a deadly signal
    # names the abort before it); a UBSan runtime error only when it is the last thing that
    # happened -- a check built to recover prints its report and the process goes on.
    for i, line in enumerate(lines):
        m = _ASAN.search(line)
        if m:
            return _from_asan(lines, i, m.group(1), m.group("rest"))
    for i, line in enumerate(lines):
        f = _LIBFUZZER.search(line)
        if f:
            return _from_libfuzzer(lines, i, f.group("rest"))
        h = _HARD_RSS.search(line)
        if h:
            report = _finish(SanitizerReport(h.group("tool"), "out-of-memory (rss)"), lines, i)
            report.text = lines[i].strip()  # what follows is the process's memory map
            return report
    last = None
    for i, line in enumerate(lines):
        u = _UBSAN.match(line.strip())
        if u:
            last = (i, u)
    if last is None:
        return None
    if any(_is_abort_line(x) for x in lines[last[0] + 1:]):
        return None  # an assert after it killed the process: the log's abort line says so
    return _from_ubsan(lines, *last)


def _is_abort_line(line: str) -> bool:
    return "GGML_ASSERT" in line or "GGML_ABORT" in line or "terminate called" in line


def _finish(report: SanitizerReport, lines: list[str], start: int) -> SanitizerReport:
    report.frames = report.frames or _frames(lines, start)
    report.project_frames = [f for f in report.frames if _is_project(f)]
    for line in lines[start:]:
        s = _SUMMARY.match(line.strip())
        if s:
            report.summary = _HEX.sub("0x?", s.group(0))
            break
    report.text = "\n".join(lines[start:start + 80])
    return report


def _from_asan(lines: list[str], i: int, tool: str, rest: str) -> SanitizerReport:
    report = SanitizerReport(tool, _clean_bug_type(rest))
    if tool == "LeakSanitizer":
        report.bug_type = "memory leak"
    for line in lines[i + 1:i + 12]:
        a = _ACCESS.match(line.strip()) or _SEGV_ACCESS.search(line)
        if a:
            report.access = a.group("op")
            if "size" in a.groupdict() and a.groupdict().get("size"):
                report.size = int(a.group("size"))
            break
    if report.bug_type in ("SEGV", "BUS"):  # the zero page is a class of its own
        hint = next((x for x in lines[i + 1:i + 12] if "Hint: address points to the zero page"
                     in x), None)
        if hint:
            report.bug_type += " (zero page)"
    report.abort_line = _abort_before(lines, i) if report.bug_type.startswith("ABRT") else ""
    return _finish(report, lines, i)


def _from_ubsan(lines: list[str], i: int, m: re.Match) -> SanitizerReport:
    # The message names values ("4294967295 * 8", addresses): keep the kind of error only.
    msg = _VALUE.sub("N", _HEX.sub("ADDR", m.group("msg")))
    report = SanitizerReport("UndefinedBehaviorSanitizer", msg[:160])
    report = _finish(report, lines, i)
    if not report.project_frames:  # without print_stacktrace the location is all there is
        report.project_frames = [Frame(f"{_base(m.group('loc'))}:{m.group('line')}")]
    return report


def _from_libfuzzer(lines: list[str], i: int, rest: str) -> SanitizerReport:
    bug = rest.strip()
    if bug.startswith("out-of-memory (malloc("):
        bug = "out-of-memory (malloc)"  # the fuzzed size is not part of the bug
    elif bug.startswith("out-of-memory"):
        bug = "out-of-memory (rss)"
    elif bug.startswith("timeout"):
        bug = "timeout"
    report = SanitizerReport("libFuzzer", _clean_bug_type(bug))
    if bug == "deadly signal":
        report.abort_line = _abort_before(lines, i)
    return _finish(report, lines, i)


_REPORT_LINE = re.compile(r"^(?P<tool>AddressSanitizer|UndefinedBehaviorSanitizer|LeakSanitizer|"
                          r"ThreadSanitizer|MemorySanitizer): (?P<rest>.*)$")


def report_key(line: str) -> tuple[str, str] | None:
    """A :meth:`SanitizerReport.signature_line` as (class, faulting project frame), or None
    for any other line. Two builds of one server (the in-process target, the live sanitizer
    server) inline differently, so only the frame where the error happened is compared."""
    m = _REPORT_LINE.match(line)
    if m is None:
        return None
    head, sep, where = line.rpartition(" in ")
    if not sep:
        return line, ""
    return head, _without_template_args(where.split(" < ", 1)[0])


# ASan errors that say only where a bad pointer landed: whether a read or write through an
# address the request computed hits freed heap, a chunk's redzone or an unmapped page is the
# process's layout (the in-process target's heap is not the live server's), as the fault
# shim's null page and wild address are (signature.bug_line).
BAD_ADDRESS_CLASSES = frozenset({
    "heap-use-after-free", "heap-buffer-overflow", "stack-buffer-overflow",
    "global-buffer-overflow", "stack-use-after-return", "stack-use-after-scope",
    "use-after-poison", "container-overflow", "unknown-crash", "wild-addr-read",
    "wild-addr-write", "SEGV"})
_ACCESS_WORD = re.compile(r"\b(READ|WRITE)\b")  # in a signature line


def same_bad_access(a: str, b: str) -> bool:
    """Do two AddressSanitizer lines name one bad read (or write) at one faulting frame, each
    of an address class (:data:`BAD_ADDRESS_CLASSES`)? Other errors (double free,
    memcpy-param-overlap, a leak) and other access types stay apart."""
    ka, kb = report_key(a), report_key(b)
    if ka is None or kb is None or not ka[1] or ka[1] != kb[1]:
        return False
    classes = []
    for head in (ka[0], kb[0]):
        tool, _, rest = head.partition(": ")
        access = _ACCESS_WORD.search(rest)
        if tool != "AddressSanitizer" or not rest or access is None:
            return False
        classes.append((rest.split()[0], access.group(1)))
    (ca, aa), (cb, ab) = classes
    return aa == ab and ca in BAD_ADDRESS_CLASSES and cb in BAD_ADDRESS_CLASSES


def _without_template_args(frame: str) -> str:
    """``f<&op_div (x.cpp)`` and ``f<&(op_div(float, float)) (x.cpp)`` are one frame: the two
    symbolizers spell (and the signature cuts) a template's arguments differently."""
    name, sep, file = frame.rpartition(" (")
    if not sep:
        name, file = frame, ""
    name = name.split("<", 1)[0]
    return f"{name} ({file}" if sep else name


# What the live campaign's own RSS sampler calls a finding (harness.fuzz.case_runner).
RSS_SAMPLED = "resident memory above the bound"
_RSS_LINES = re.compile(r"^(?:\w+Sanitizer: out-of-memory \(rss\)|libFuzzer: out-of-memory "
                        r"\(rss\)|" + re.escape(RSS_SAMPLED) + r")$")


def rss_bound(line: str) -> bool:
    """Does a memory finding's line say resident memory passed the bound? The sanitizer
    runtime's RSS thread and the live campaign's sampler see one bound passed: which of them
    noticed first is timing, not another bug."""
    return bool(_RSS_LINES.match(line))


def same_report(a: str, b: str) -> bool:
    """Do two signature lines name the same sanitizer error (class and faulting frame)?"""
    ka = report_key(a)
    return ka is not None and ka == report_key(b)

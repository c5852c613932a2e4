#!/usr/bin/env python3
"""Progress on a terminal: the long commands (convert, verify) show how far they are on
stderr when it is a terminal, one line rewritten in place ("\\rwsync: 1.2 MB of 3.4 MB
written (35%)") and ended before the program exits; -q, or a stderr that is not a
terminal, shows none.  stderr is a pseudo-terminal here (Python's pty); where none can be
opened (a chroot without /dev/pts) the tests are skipped with a line saying so.

Prints TAP.  Accepts and ignores --tap and -k (tests/tap-test passes them).
Environment (Makefile.am's AM_TESTS_ENVIRONMENT): WSYNC_TEST_BINARY,
WSYNC_TEST_BUILT_PLUGIN_DIR, WSYNC_TEST_CONF_DIR."""

import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # never write into the source tree (make distcheck)
SRC = os.path.dirname(os.path.abspath(__file__))
BINARY = os.environ.get("WSYNC_TEST_BINARY") or os.path.join(SRC, "..", "wsync")
CONF_DIR = os.environ.get("WSYNC_TEST_CONF_DIR") or os.path.join(SRC, "..", "conf.d")
PLUGIN_DIR = os.environ.get("WSYNC_TEST_BUILT_PLUGIN_DIR") or os.path.join(SRC, "..", "plugins",
                                                                         ".libs")
CONFIG = os.path.join(SRC, "..", "configs", "tiny-qwen3-moe.json")
# one progress line: "\rwsync: DONE of TOTAL VERB (N%)" and spaces that clear what a
# longer line left (sizes as GLib's g_format_size() writes them, with a no-break space)
LINE = re.compile(r"\rwsync: [0-9.]+\s(?:bytes|kB|MB|GB) of [0-9.]+\s(?:bytes|kB|MB|GB) "
                  r"(written|compared) \((\d+)%\) *")


def wsync(*args):
    return [BINARY, "--conf-dir", CONF_DIR, "--plugin-dir", PLUGIN_DIR] + list(args)


def on_terminal(args):
    """Runs @args with stderr on a pseudo-terminal; returns (status, stdout, what the
    terminal received), its line ends as the program wrote them."""
    import pty
    import termios
    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # no "\n" -> "\r\n": see the bytes the program wrote
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the program closed its end
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    out = p.stdout.read()
    p.stdout.close()
    return p.wait(), out.decode(), seen.decode()


def check_progress(c, seen, verb):
    """@seen is progress lines of @verb only, the last at 100% and ended by a newline."""
    c.append("" if seen.endswith("\n") else "the progress line is not ended: %r" % seen)
    lines = LINE.findall(seen)
    rest = LINE.sub("", seen)
    c.append("" if lines and rest == "\n" else "not progress lines only: %r" % seen)
    c.append("" if lines and all(v == verb for v, _ in lines) else "not %s: %r" % (verb, seen))
    c.append("" if lines and lines[-1][1] == "100" else "the last line is not 100%%: %r" % seen)
    c.append("" if [p for _, p in lines].count("100") == 1 else "100%% twice: %r" % seen)


def main(argv):
    for arg in argv[1:]:
        if arg not in ("--tap", "-k"):
            print("usage: %s [--tap] [-k]" % argv[0], file=sys.stderr)
            return 2
    work = tempfile.mkdtemp(prefix="wsync-progress-test-")
    try:
        return run_tests(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_tests(work):
    src, same, dst = (os.path.join(work, n) for n in ("src", "same", "dst"))
    subprocess.run(wsync("synth", "--config", CONFIG, src, "-q"), check=True)
    shutil.copytree(src, same)
    tests = []

    def convert():
        c = []
        status, out, seen = on_terminal(wsync("convert", src, dst, "--target", "vllm", "--tp",
                                              "2"))
        c.append("" if status == 0 else "exit %d: %r" % (status, seen))
        c.append("" if out.startswith("wrote %s: " % dst) else "stdout: %r" % out)
        check_progress(c, seen, "written")
        return c
    tests.append(("convert shows what it wrote, ending at 100%", convert))

    def verify_equal():
        c = []
        status, out, seen = on_terminal(wsync("verify", src, same))
        c.append("" if status == 0 else "exit %d: %r" % (status, seen))
        c.append("" if out.startswith("equal: ") else "stdout: %r" % out)
        check_progress(c, seen, "compared")
        return c
    tests.append(("verify shows what it compared, ending at 100%", verify_equal))

    def verify_different():
        # the last tensor of the sorted names differs: progress was shown, and its line
        # is ended before the verdict
        other = os.path.join(work, "other")
        shutil.copytree(src, other)
        path = os.path.join(other, "model-00001-of-00001.safetensors")
        with open(path, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 1]))
        c = []
        status, out, seen = on_terminal(wsync("verify", src, other))
        c.append("" if status == 1 else "exit %d: %r" % (status, seen))
        c.append("" if out.startswith("differ: tensor ") else "stdout: %r" % out)
        c.append("" if LINE.search(seen) and seen.endswith("\n") else
                 "no ended progress line: %r" % seen)
        return c
    tests.append(("verify of a difference ends its progress line", verify_different))

    def quiet():
        c = []
        shutil.rmtree(dst, ignore_errors=True)
        for args in (("convert", src, dst, "--target", "vllm", "-q"), ("verify", src, same, "-q")):
            status, out, seen = on_terminal(wsync(*args))
            c.append("" if status == 0 else "%s: exit %d" % (args[0], status))
            c.append("" if seen == "" else "%s -q showed %r" % (args[0], seen))
        return c
    tests.append(("-q shows no progress", quiet))

    def not_a_terminal():
        shutil.rmtree(dst, ignore_errors=True)
        c = []
        for args in (("convert", src, dst, "--target", "vllm"), ("verify", src, same)):
            r = subprocess.run(wsync(*args), capture_output=True, text=True)
            c.append("" if r.returncode == 0 else "%s: exit %d" % (args[0], r.returncode))
            c.append("" if r.stderr == "" else "%s to a pipe showed %r" % (args[0], r.stderr))
        return c
    tests.append(("stderr not a terminal: no progress", not_a_terminal))

    why_not = None
    try:
        import pty
        m, s = pty.openpty()
        os.close(m)
        os.close(s)
    except (ImportError, OSError) as e:
        why_not = "no pseudo-terminal can be opened here (%s)" % e
    print("1..%d" % len(tests))
    failures = 0
    for number, (name, check) in enumerate(tests, 1):
        if why_not is not None and check is not not_a_terminal:
            print("ok %d - %s # SKIP %s" % (number, name, why_not))
            continue
        problems = [p for p in check() if p]
        print("%s %d - %s" % ("not ok" if problems else "ok", number, name))
        for p in problems[:8]:
            print("# " + p)
        failures += 1 if problems else 0
        sys.stdout.flush()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

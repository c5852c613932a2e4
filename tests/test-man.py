#!/usr/bin/env python3
"""The man pages against the program they describe, so that neither can drift:

- wsync(1) has a section for every command `wsync --help` lists and for no other; each
  section lists exactly the long options `wsync COMMAND --help` prints besides the
  options of every command, which GLOBAL OPTIONS lists exactly (with --version);
  `wsync sync --help` is wsync-mpi's, so without it (WSYNC_TEST_MPI is not yes) only
  sync's section is required, and a note says its options went unchecked;
  EXIT STATUS lists exactly the statuses of `wsync --help`;
- wsync.conf(5)'s PLUGINS section is what man/plugin-options.py makes of
  `wsync plugins --json` for the plugins of conf.d (their descriptions, and every
  option's type, default, values and description from the plugin's own table); every
  key its sync section lists is one a conf.d file may set;
- README.md's table of targets ("### Targets") lists, as rows of that one table, exactly
  the targets `wsync convert --help` lists;
- groff -ww reads both pages without a warning (skipped, with a line saying so, when
  groff is not installed).

Prints TAP.  Accepts and ignores --tap and -k (tests/tap-test passes them).
Environment (Makefile.am's AM_TESTS_ENVIRONMENT): WSYNC_TEST_BINARY,
WSYNC_TEST_BUILT_PLUGIN_DIR, WSYNC_TEST_CONF_DIR, WSYNC_LIBEXECDIR, WSYNC_TEST_MPI,
G_TEST_SRCDIR, G_TEST_BUILDDIR."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # never write into the source tree (make distcheck)
SRC = os.path.dirname(os.path.abspath(__file__))
import importlib.util  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "plugin_options", os.path.join(SRC, "..", "man", "plugin-options.py"))
plugin_options = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plugin_options)

MAN_DIR = os.path.join(os.environ.get("G_TEST_BUILDDIR", SRC), "..", "man")
LONG_OPTION = re.compile(r"--[a-z][a-z0-9-]*")


def env(name):
    value = os.environ.get(name)
    if not value:
        raise SystemExit("Bail out! %s is not set: run the tests with make check" % name)
    return value


def wsync(*args):
    """A run of the built wsync with the tree's conf.d and plugins, in the C locale."""
    argv = [env("WSYNC_TEST_BINARY"), "--conf-dir", env("WSYNC_TEST_CONF_DIR"),
            "--plugin-dir", env("WSYNC_TEST_BUILT_PLUGIN_DIR")] + list(args)
    return subprocess.run(argv, capture_output=True, text=True,
                          env=dict(os.environ, LC_ALL="C", WSYNC_PLUGIN_PATH=""))


def help_block(text, heading):
    """The lines of @text after the line @heading, up to the next empty line."""
    lines = text.split("\n")
    start = lines.index(heading) + 1
    end = lines.index("", start) if "" in lines[start:] else len(lines)
    return lines[start:end]


def options_of(lines):
    """The long options that begin the lines (`  -t, --target=T  ...`, `  --json  ...`)."""
    found = set()
    for line in lines:
        m = re.match(r"\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", line)
        if m:
            found.add(m.group(1))
    return found


def read_page(name):
    with open(os.path.join(MAN_DIR, name), encoding="utf-8") as f:
        return f.read()


def page_sections(text, macro):
    """{heading: [lines]} for every @macro (.SH or .SS) heading of a page."""
    found, current = {}, None
    for line in text.split("\n"):
        if line.startswith(macro + " "):
            current = line[len(macro) + 1:].strip('"').replace("\\-", "-")
            found[current] = []
        elif line.startswith(".SH ") and current is not None and macro == ".SS":
            current = None
        elif current is not None:
            found[current].append(line)
    return found


def tags(lines):
    """The tag lines of .TP paragraphs, with roff's \\- read as -."""
    return [lines[i + 1].replace("\\-", "-") for i, line in enumerate(lines[:-1])
            if line == ".TP"]


def tag_options(lines):
    return {o for tag in tags(lines) for o in LONG_OPTION.findall(tag)}


def differences(what, want, have):
    out = []
    if want - have:
        out.append("%s: missing from the page: %s" % (what, ", ".join(sorted(want - have))))
    if have - want:
        out.append("%s: on the page but not in the program: %s"
                   % (what, ", ".join(sorted(have - want))))
    return out


# ------------------------------------------------------------------ wsync(1)

def main_help():
    r = wsync("--help")
    if r.returncode != 0:
        raise SystemExit("Bail out! wsync --help: exit %d: %s" % (r.returncode, r.stderr))
    return r.stdout


def check_commands(page):
    text = main_help()
    commands = [line.split()[0] for line in help_block(text, "Commands:")]
    global_options = options_of(help_block(text, "Options of every command:"))
    problems, notes = [], []
    sections = page_sections(page, ".SH")
    problems += differences("GLOBAL OPTIONS", global_options,
                            tag_options(sections.get("GLOBAL OPTIONS", [])))
    subsections = page_sections(page, ".SS")
    documented = {h.split()[1]: lines for h, lines in subsections.items()
                  if h.startswith("wsync ") and len(h.split()) > 1}
    problems += differences("commands", set(commands), set(documented))
    for command in commands:
        if command == "sync" and os.environ.get("WSYNC_TEST_MPI") != "yes":
            # `wsync sync --help` is wsync-mpi's help: without it only the section's
            # presence is checked
            notes.append("wsync-mpi is not built here (configure --with-mpi): the options "
                         "of wsync sync are not checked")
            continue
        r = wsync(command, "--help")
        if r.returncode != 0:
            problems.append("wsync %s --help: exit %d" % (command, r.returncode))
            continue
        own = options_of(help_block(r.stdout, "Options:")) - global_options
        problems += differences("wsync %s" % command, own,
                                tag_options(documented.get(command, [])))
    return problems, notes


def check_exit_statuses(page):
    text = " ".join(main_help().split())
    listed = text[text.index("Exit status:"):]
    want = set(re.findall(r"(?:: |, )(\d+) ", listed))
    have = {t.strip().split()[-1] for t in tags(page_sections(page, ".SH")["EXIT STATUS"])}
    problems = differences("exit statuses", want, have)
    if len(want) < 5:
        problems.append("wsync --help lists %d exit statuses, not 5: %s" % (len(want), listed))
    return problems


BOLD = re.compile(r"\\fB([^\\]+)\\f[RP]")


def bold_words(lines):
    """The words a section sets in bold: .B and .BR's first, third ... arguments, and
    \\fB...\\fR spans."""
    out = set()
    for line in lines:
        out.update(w for span in BOLD.findall(line) for w in span.split())
        if line.startswith((".B ", ".BR ")):
            args = re.findall(r'"[^"]*"|\S+', line.split(" ", 1)[1])
            out.update(a.strip('"').replace("\\-", "-").strip(" ,;.()")
                       for a in args[::2] if a.strip('"').strip())
    return out


def check_inspect_json_keys(page):
    """Every key of `wsync inspect --json` of a checkpoint directory, at the top level and
    in a tensor, is named in the inspect section (before: only "metadata" was, and nothing
    said total_bytes counts the tensors' bytes, not the files')."""
    work = tempfile.mkdtemp(prefix="wsync-test-man.")
    try:
        src = os.path.join(work, "tiny")
        r = wsync("synth", "-q", "--config", os.path.join(SRC, "..", "configs",
                                                          "tiny-qwen3-moe.json"), src)
        if r.returncode != 0:
            return ["wsync synth: exit %d: %s" % (r.returncode, r.stderr)]
        r = wsync("--json", "inspect", src)
        if r.returncode != 0:
            return ["wsync inspect --json: exit %d: %s" % (r.returncode, r.stderr)]
        data = json.loads(r.stdout)
        files = sum(os.path.getsize(f) for f in data["files"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    keys = set(data) | {k for t in data["tensors"] for k in t}
    lines = next(v for h, v in page_sections(page, ".SS").items() if h.startswith("wsync inspect"))
    problems = ["wsync inspect --json: key %s is not named in the inspect section" % k
                for k in sorted(keys - bold_words(lines))]
    # what the page says total_bytes is
    if data["total_bytes"] != sum(t["bytes"] for t in data["tensors"]) or files <= data["total_bytes"]:
        problems.append("total_bytes %d: not the tensors' %d bytes, or not below the files' %d"
                        % (data["total_bytes"], sum(t["bytes"] for t in data["tensors"]), files))
    return problems


# ------------------------------------------------------------------ wsync.conf(5)

def plugins_json():
    r = wsync("plugins", "--json", "-q")
    if r.returncode != 0:
        raise SystemExit("Bail out! wsync plugins --json: exit %d: %s"
                         % (r.returncode, r.stderr))
    return json.loads(r.stdout)


def check_plugin_options(page):
    data = plugins_json()
    try:
        want = plugin_options.blocks(data)
    except plugin_options.Undocumented as e:
        return [str(e)]
    have = plugin_options.page_blocks(page)
    problems, notes = [], []
    for plugin in data["plugins"]:
        name = plugin["name"]
        if name in want:
            if have.get(name) != want[name]:
                problems.append('plugin "%s": the page says\n%s\nthe plugin says\n%s'
                                "(make update-man rewrites the page)"
                                % (name, have.get(name, "(nothing)"), want[name]))
        elif (plugin["reason"] or "").startswith("no %s.so in the plugin path" % name):
            notes.append('plugin "%s" is not built here: its section is not checked' % name)
            if name not in have:
                problems.append('plugin "%s": no section on the page' % name)
        else:
            problems.append('plugin "%s" is %s: %s' % (name, plugin["state"], plugin["reason"]))
    named = {p["name"] for p in data["plugins"]}
    for name in sorted(set(have) - named):
        problems.append('plugin "%s" has a section on the page but conf.d does not select it'
                        % name)
    if len(want) < 1:
        problems.append("no plugin of conf.d was loaded")
    return problems, notes


def check_sync_keys(page):
    """Each key of THE SYNC SECTION, set in a conf.d file, is accepted; a key that is
    not one is refused (so acceptance means something)."""
    lines = page_sections(page, ".SH")["THE SYNC SECTION"]
    keys = []
    for tag in tags(lines):
        m = re.match(r"\\fB([a-z-]+)\\fR \((int|string)\)$", tag)
        if m:
            keys.append((m.group(1), m.group(2)))
    problems = [] if len(keys) >= 7 else ["the sync section lists %d keys" % len(keys)]
    work = tempfile.mkdtemp(prefix="wsync-test-man-")
    try:
        for key, kind in keys + [("no-such-key", "int")]:
            conf = os.path.join(work, "10.conf")
            with open(conf, "w", encoding="utf-8") as f:
                f.write("sync {\n  %s = %s\n}\n" % (key, "2" if kind == "int" else '"2"'))
            r = subprocess.run([env("WSYNC_TEST_BINARY"), "--conf-dir", work, "plugins"],
                               capture_output=True, text=True)
            accepted = r.returncode == 0
            if accepted != (key != "no-such-key"):
                problems.append("sync { %s = ... }: exit %d %s" % (key, r.returncode, r.stderr))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return problems


# ------------------------------------------------------------------ groff

def help_targets():
    """The targets `wsync convert --help` lists: the names at the start of the lines
    indented by two spaces after "Targets (of the plugins...)"."""
    r = wsync("convert", "--help")
    if r.returncode != 0:
        raise SystemExit("Bail out! wsync convert --help: exit %d: %s" % (r.returncode, r.stderr))
    lines = r.stdout.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("Targets"))
    names = []
    for line in lines[start + 1:]:
        m = re.match(r"  ([a-z0-9-]+)(:| \()", line)
        if m:
            names.append(m.group(1))
        elif line and not line.startswith("   "):
            break
    return names


def check_readme_targets():
    """The rows of README.md's targets table, which ends at the first line that is not a
    row: a row set apart by a paragraph is no longer in the table."""
    with open(os.path.join(SRC, "..", "README.md"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    start = lines.index("### Targets")
    header = next(i for i in range(start, len(lines)) if lines[i].startswith("| target |"))
    rows = []
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        m = re.match(r"\| `([a-z0-9-]+)` \|", line)
        rows.append(m.group(1) if m else line)
    return differences("README.md's targets table against wsync convert --help",
                       set(help_targets()), set(rows))


def check_groff(name, device):
    r = subprocess.run(["groff", "-ww", "-z", "-man", "-T" + device,
                        os.path.join(MAN_DIR, name)],
                       capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"))
    problems = []
    if r.returncode != 0 or r.stderr:
        problems.append("groff -ww -z -man -T%s %s: exit %d" % (device, name, r.returncode))
        problems += r.stderr.rstrip("\n").split("\n")
    return problems


def main(argv):
    for arg in argv[1:]:
        if arg not in ("--tap", "-k"):
            print("usage: %s [--tap] [-k]" % argv[0], file=sys.stderr)
            return 2
    wsync1, conf5 = read_page("wsync.1"), read_page("wsync.conf.5")
    have_groff = shutil.which("groff") is not None
    cases = [
        ("wsync.1: every command, exactly its options", lambda: check_commands(wsync1)),
        ("wsync.1: every exit status", lambda: check_exit_statuses(wsync1)),
        ("wsync.1: every key of inspect --json", lambda: check_inspect_json_keys(wsync1)),
        ("wsync.conf.5: the plugins' options as the plugins declare them",
         lambda: check_plugin_options(conf5)),
        ("wsync.conf.5: the sync section's keys", lambda: check_sync_keys(conf5)),
        ("README.md: the targets table lists every target", check_readme_targets),
    ]
    for page in ("wsync.1", "wsync.conf.5"):
        for device in ("ps", "utf8"):
            cases.append(("groff -ww -z -man -T%s %s" % (device, page),
                          (lambda p=page, d=device: check_groff(p, d)) if have_groff
                          else None))
    print("1..%d" % len(cases))
    failures = 0
    for number, (name, run) in enumerate(cases, 1):
        if run is None:
            print("ok %d - %s # SKIP groff is not installed (apt-get install groff-base)"
                  % (number, name))
            continue
        result = run()
        problems, notes = result if isinstance(result, tuple) else (result, [])
        print("%s %d - %s" % ("not ok" if problems else "ok", number, name))
        for line in notes + problems:
            for part in line.split("\n"):
                print("# " + part)
        failures += bool(problems)
        sys.stdout.flush()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

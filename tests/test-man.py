#!/usr/bin/env python3
"""The man pages and README.md against the program they describe, so that none drifts:

- wsync(1) has a section for every command `wsync --help` lists and for no other; each
  section lists exactly the long options `wsync COMMAND --help` prints besides the
  options of every command, which GLOBAL OPTIONS lists exactly (with --version);
  `wsync sync --help` is wsync-mpi's, so without it (WSYNC_TEST_MPI is not yes) only
  sync's section is required, and a note says its options went unchecked;
  EXIT STATUS lists exactly the statuses of `wsync --help`; ENVIRONMENT exactly the
  variables core/ reads, and every value of WSYNC_TRANSPOSE; the sections of verify,
  plan, plugins and env set in bold, after "With --json", every key those commands print
  (plan's as convert and synth print them too), and only keys of the source that prints
  them;
- wsync.conf(5)'s PLUGINS section is what man/plugin-options.py makes of
  `wsync plugins --json` for the plugins of conf.d (their descriptions, and every
  option's type, default, values and description from the plugin's own table); every
  key its sync section lists is one a conf.d file may set;
- README.md's table of commands gives each command of `wsync --help` with exactly the
  options of `wsync COMMAND --help` (a short form for its long one), and wsync(1) each
  short form `wsync COMMAND --help` gives;
- every wsync invocation README.md, docs/*.md, conf.d's comments and the man pages'
  examples show names a command and only its options, and gives the options the
  command cannot run without (REQUIRED_OPTIONS, themselves checked against the program);
- README.md's table of targets ("### Targets") lists, as rows of that one table, exactly
  the targets `wsync convert --help` lists;
- README.md's two newcomer commands (main-command, test-command) install exactly the
  build's toolchain and the packages of what configure.ac checks for, the test command
  also what only the tests use (valgrind, groff-base, python3-numpy);
- what `wsync convert --help` prints, and the notes and refusals of `wsync plan` for every
  release of its naming table, cite the facts as docs/NAME.md §N of a file that exists
  (FILES says so), never as a bare §N;
- every docs/NAME.md §N that README.md, docs/, the man pages, conf.d and the sources cite
  is a numbered heading of docs/NAME.md;
- groff -ww reads both pages without a warning (skipped, with a line saying so, when
  groff is not installed).

Prints TAP.  Accepts and ignores --tap and -k (tests/tap-test passes them).
Environment (Makefile.am's AM_TESTS_ENVIRONMENT): WSYNC_TEST_BINARY,
WSYNC_TEST_BUILT_PLUGIN_DIR, WSYNC_TEST_CONF_DIR, WSYNC_LIBEXECDIR, WSYNC_TEST_MPI,
G_TEST_SRCDIR, G_TEST_BUILDDIR."""

import json
import os
import re
import shlex
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
        section_tags = tags(documented.get(command, []))
        problems += differences("wsync %s" % command, own,
                                {o for tag in section_tags for o in LONG_OPTION.findall(tag)})
        for short, long in short_options(help_block(r.stdout, "Options:")):
            if long in own and not any(re.search(r"(^|[^\w-])%s\W" % short, tag) and long in tag
                                       for tag in section_tags):
                problems.append("wsync %s: the page does not give %s as %s"
                                % (command, long, short))
    return problems, notes


def short_options(lines):
    """The (short, long) pairs of the lines that begin `  -t, --target=T  ...`."""
    return [m.groups() for m in (re.match(r"\s+(-\w), (--[a-z][a-z0-9-]*)", line)
                                 for line in lines) if m]


def check_readme_commands():
    """README.md's table of commands (and the line of `mpirun ... wsync sync`) gives every
    command of `wsync --help` with exactly the options of `wsync COMMAND --help` besides
    those of every command (a short form standing for its long one)."""
    text = main_help()
    commands = [line.split()[0] for line in help_block(text, "Commands:")]
    global_options = options_of(help_block(text, "Options of every command:"))
    with open(os.path.join(SRC, "..", "README.md"), encoding="utf-8") as f:
        readme = f.read()
    readme = readme[readme.index("\n## Commands\n"):]
    usages = {}
    usage = r"^(?:\| )?`(?:mpirun -np N )?wsync ([a-z]+)((?:[^`]|`(?!\s*\|))*?)`"
    for m in re.finditer(usage, readme, re.M):
        usages.setdefault(m.group(1), m.group(2))
    problems = differences("README.md's commands against wsync --help", set(commands),
                           set(usages))
    for command in commands:
        if command not in usages or (command == "sync"
                                     and os.environ.get("WSYNC_TEST_MPI") != "yes"):
            continue
        lines = help_block(wsync(command, "--help").stdout, "Options:")
        own = options_of(lines) - global_options
        long_of = dict(short_options(lines))
        given = set(LONG_OPTION.findall(usages[command]))
        given |= {long_of.get(s, s) for s in re.findall(r"(?<![\w-])-[a-zA-Z](?![\w-])",
                                                        usages[command])}
        problems += differences("README.md's wsync %s" % command, own, given)
    return [p.replace("missing from the page", "missing from README.md")
            .replace("on the page but not in the program", "in README.md but not in --help")
            for p in problems]


def check_exit_statuses(page):
    text = " ".join(main_help().split())
    listed = text[text.index("Exit status:"):]
    want = set(re.findall(r"(?:: |, )(\d+) ", listed))
    have = {t.strip().split()[-1] for t in tags(page_sections(page, ".SH")["EXIT STATUS"])}
    problems = differences("exit statuses", want, have)
    if len(want) < 5:
        problems.append("wsync --help lists %d exit statuses, not 5: %s" % (len(want), listed))
    return problems


def read_source(*parts):
    with open(os.path.join(SRC, "..", *parts), encoding="utf-8") as f:
        return f.read()


def check_environment(page):
    """ENVIRONMENT lists exactly the variables the program reads (the g_getenv() calls of
    core/), and WSYNC_TRANSPOSE's entry names every value it takes (core/transpose.c's
    path_names), so that a kernel added there is documented too."""
    core = os.path.join(SRC, "..", "core")
    read = set()
    for name in sorted(os.listdir(core)):
        if name.endswith(".c"):
            read |= set(re.findall(r'g_getenv\("([A-Z][A-Z0-9_]*)"\)',
                                   read_source("core", name)))
    section = page_sections(page, ".SH").get("ENVIRONMENT", [])
    documented = {t.split()[-1] for t in tags(section) if t.startswith(".B ")}
    problems = differences("ENVIRONMENT", read, documented)
    if len(read) < 3:
        problems.append("found %d g_getenv() calls in core/: %s" % (len(read), sorted(read)))
    m = re.search(r"path_names\[[^]]*\] = \{([^}]*)\}", read_source("core", "transpose.c"))
    values = re.findall(r'"([a-z0-9]+)"', m.group(1)) if m else []
    if len(values) < 2:
        problems.append("core/transpose.c: no path_names found")
    tagline = ".B WSYNC_TRANSPOSE"
    entry = section[section.index(tagline) + 1:] if tagline in section else []
    entry = entry[:entry.index(".TP")] if ".TP" in entry else entry
    words = set(re.findall(r"^\.BR? ([a-z0-9]+)", "\n".join(entry), re.M))
    problems += ["WSYNC_TRANSPOSE: the page does not name the value %s" % v
                 for v in values if v not in words]
    return problems


CITATION = re.compile(r"docs/([A-Za-z0-9_.-]+?)\.md §[0-9.]*[0-9](?:(?:, | and )§[0-9.]*[0-9])*")


def uncited(what, text):
    """The problems of the section signs of @text: FILES says the notes, the errors and
    --help cite the facts as docs/NAME.md §N, so a bare §N, or a NAME that is not a file
    of docs/, leaves the reader without the source."""
    problems = []
    text = " ".join(text.split())
    for m in CITATION.finditer(text):
        if not os.path.isfile(os.path.join(SRC, "..", "docs", m.group(1) + ".md")):
            problems.append("%s cites docs/%s.md, which does not exist" % (what, m.group(1)))
    rest = CITATION.sub("", text)
    for m in re.finditer("§", rest):
        problems.append("%s: a § that names no docs/ file: ...%s..."
                        % (what, rest[max(0, m.start() - 70):m.end() + 5]))
    return problems


def unbuilt(*names):
    """Those of the plugins @names that are not active here (./configure
    --disable-plugin-NAME): the checks that run them are then skipped, with a note."""
    active = {p["name"] for p in plugins_json()["plugins"] if p["state"] == "active"}
    return [name for name in names if name not in active]


def check_citations():
    """What `wsync convert --help` and `wsync plan` print for every release of the naming
    table (both vLLM targets and formats, with and without EP: notes and refusals)."""
    missing = unbuilt("hf", "qwen3_moe", "vllm", "npu-ascend")
    if missing:
        return [], ["plugins %s are not built here: the citations are not checked"
                    % ", ".join(missing)]
    r = wsync("convert", "--help")
    problems = uncited("wsync convert --help", r.stdout + r.stderr)
    releases = ["latest"]
    for line in r.stdout.split("\n"):
        m = re.match(r"\s+(\d+\.\d+(?:\.\d+)?)[ .]", line)
        if m and m.group(1) not in releases:
            releases.append(m.group(1))
    if len(releases) < 5:
        problems.append("wsync convert --help: found only the releases %s" % releases)
    work = tempfile.mkdtemp(prefix="wsync-test-man-")
    try:
        src = os.path.join(work, "hf")
        config = os.path.join(SRC, "..", "configs", "tiny-qwen3-moe.json")
        made = wsync("synth", "-q", "--config", config, src)
        if made.returncode != 0:
            return problems + ["wsync synth: exit %d: %s" % (made.returncode, made.stderr)]
        conf = os.path.join(work, "conf.d")
        os.mkdir(conf)
        for name in os.listdir(env("WSYNC_TEST_CONF_DIR")):
            if name.endswith(".conf"):
                shutil.copy(os.path.join(env("WSYNC_TEST_CONF_DIR"), name), conf)
                os.chmod(os.path.join(conf, name), 0o644)
        for release in releases:
            path = os.path.join(conf, "99-release.conf")
            with open(path, "w", encoding="utf-8") as f:
                f.write('plugin "vllm" {\n  vllm-version = "%s"\n}\n' % release)
            os.chmod(path, 0o644)  # a conf.d file writable by others is refused
            for target in ("vllm", "vllm-ascend"):
                for form in ("sharded-state", "kernel"):
                    for ep in ("1", "2"):
                        argv = ["plan", src, "--target", target, "--format", form,
                                "--tp", "2", "--ep", ep]
                        run = subprocess.run(
                            [env("WSYNC_TEST_BINARY"), "--conf-dir", conf, "--plugin-dir",
                             env("WSYNC_TEST_BUILT_PLUGIN_DIR")] + argv,
                            capture_output=True, text=True,
                            env=dict(os.environ, LC_ALL="C", WSYNC_PLUGIN_PATH=""))
                        notes = [line for line in run.stdout.split("\n")
                                 if line.startswith("note:")]
                        what = "vllm-version %s: wsync plan SRC %s" % (release,
                                                                       " ".join(argv[2:]))
                        problems += uncited(what, "\n".join(notes) + run.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return sorted(set(problems))


def doc_sections(name):
    """The section numbers of docs/NAME.md's headings ("## 9. ..." is 9, "### 9.4 ..." 9.4)."""
    found = set()
    for line in read_source("docs", name + ".md").split("\n"):
        m = re.match(r"#+\s+([0-9]+(?:\.[0-9]+)*)[.\s]", line)
        if m:
            found.add(m.group(1))
    return found


def check_citation_targets():
    """Every docs/NAME.md §N that README.md, docs/, the man pages, conf.d and the sources
    (core/, include/, plugins/, python/) cite, wrapped over lines or not, names a section
    heading of that file: a section renumbered or removed would leave the reader of a
    note or a comment looking for nothing."""
    root = os.path.join(SRC, "..")
    files = ["README.md"]
    for folder, suffixes in (("docs", (".md",)), ("man", (".in",)), ("conf.d", (".conf",)),
                             ("core", (".c", ".h")), ("include/wsync", (".h",)),
                             ("plugins", (".c",)), ("python", (".c", ".h")),
                             ("python/wsync", (".py",))):
        where = os.path.join(root, folder)
        files += [folder + "/" + n for n in sorted(os.listdir(where) if os.path.isdir(where)
                                                   else []) if n.endswith(suffixes)]
    sections, problems, seen = {}, [], 0
    for name in files:
        # a citation wrapped in a comment: the next line's leader (" * ", "# ", "// ") out
        text = re.sub(r"\s*\n\s*(?:\*(?!/)|#+|//)?\s*", " ",
                      read_source(*name.split("/")).replace("\\(sc", "§"))
        for m in CITATION.finditer(text):
            doc = m.group(1)
            if not os.path.exists(os.path.join(root, "docs", doc + ".md")):
                problems.append("%s: %s: there is no docs/%s.md" % (name, m.group(0), doc))
                continue
            if doc not in sections:
                sections[doc] = doc_sections(doc)
            for number in re.findall(r"§([0-9.]*[0-9])", m.group(0)):
                seen += 1
                if number not in sections[doc]:
                    problems.append("%s: %s: docs/%s.md has no section %s"
                                    % (name, m.group(0), doc, number))
    if seen < 50:
        problems.append("found only %d citations" % seen)
    return problems


def bold_words(lines):
    """The words set in bold by the macros (.B, .BR, .RB, .BI, .IB) and \\fB of @lines."""
    words = []
    for line in lines:
        line = line.replace("\\-", "-")
        words += re.findall(r"\\fB(.*?)\\f[RPI]", line)
        macro, _, rest = line.partition(" ")
        try:
            args = shlex.split(rest)
        except ValueError:
            continue
        start = {".B": None, ".BR": 0, ".BI": 0, ".RB": 1, ".IB": 1}.get(macro, -1)
        if start is None:
            words += args
        elif start >= 0:
            words += args[start::2]
    return words


def json_paragraph(section):
    """The lines of @section from the one that opens "With --json:" (or ",") to the end
    of its paragraph."""
    for i, line in enumerate(section):
        if re.match(r"\.BR \\-\\-json [:,]$", line):
            end = next((j for j in range(i + 1, len(section))
                        if section[j].split(" ")[0] in (".TP", ".PP", ".SS", ".SH")),
                       len(section))
            return section[i + 1:end]
    return []


def json_keys(value, skip=("metadata",)):
    """Every member name of the JSON @value, at every level, but not those under the
    members @skip names (data, such as a file's __metadata__)."""
    keys = set()
    if isinstance(value, dict):
        for key, member in value.items():
            keys.add(key)
            if key not in skip:
                keys |= json_keys(member, skip)
    elif isinstance(value, list):
        for member in value:
            keys |= json_keys(member, skip)
    return keys


def check_json_keys(page):
    """The keys wsync verify, plan (as convert and synth print it too), plugins and env
    print with --json are among those their sections of wsync(1) set in bold after "With
    --json", and each of those is a key of the source file that prints them."""
    missing = unbuilt("hf", "qwen3_moe", "vllm", "npu-ascend")
    if missing:
        return [], ["plugins %s are not built here: the --json keys are not checked"
                    % ", ".join(missing)]
    problems = []
    work = tempfile.mkdtemp(prefix="wsync-test-man-")
    try:
        config = os.path.join(SRC, "..", "configs", "tiny-qwen3-moe.json")
        a, b, out = (os.path.join(work, n) for n in ("a", "b", "out"))
        for dst, seed in ((a, "0"), (b, "1")):
            made = wsync("synth", "-q", "--config", config, "--seed", seed, dst)
            if made.returncode != 0:
                return ["wsync synth: exit %d: %s" % (made.returncode, made.stderr)]
        # rank files hold lm_head.weight once per rank: verify's "file-count" difference
        ranks = os.path.join(work, "ranks")
        made = wsync("convert", "-q", a, ranks, "--target", "vllm", "--tp", "2")
        if made.returncode != 0:
            return ["wsync convert: exit %d: %s" % (made.returncode, made.stderr)]
        runs = {
            "verify": [["verify", a, a], ["verify", a, b], ["verify", ranks, a]],
            # tp 2: a fill (the attention scale buffers), copies, a padded vocabulary
            "plugins": [["plugins"]],
            "env": [["env", "--backend", "npu-ascend", "--mode", "colocate"]],
            "plan": [["plan", a, "--target", "vllm", "--tp", "2"],
                     ["convert", a, out, "--target", "vllm", "--tp", "2"],
                     ["synth", "--config", config, os.path.join(work, "s")]],
        }
        sources = {"verify": "cmd-verify.c", "plan": "plan-print.c",
                   "plugins": "cmd-plugins.c", "env": "cmd-env.c"}
        sections = {h.split()[1]: lines for h, lines in page_sections(page, ".SS").items()
                    if h.startswith("wsync ") and len(h.split()) > 1}
        printed_kinds = set()
        for command, argvs in runs.items():
            printed = set()
            for argv in argvs:
                r = wsync(*(argv + ["--json"]))
                if r.returncode not in (0, 1):
                    problems.append("wsync %s --json: exit %d: %s"
                                    % (" ".join(argv[:1]), r.returncode, r.stderr))
                    continue
                printed |= json_keys(json.loads(r.stdout))
                if command == "verify" and json.loads(r.stdout)["difference"]:
                    printed_kinds.add(json.loads(r.stdout)["difference"]["kind"])
            words = {w for w in bold_words(json_paragraph(sections.get(command, [])))
                     if re.match(r"[a-z_]+$", w)}
            # (the page also names keys that only some inputs make, such as a metadata
            # difference's: those must be keys of the source)
            problems += [line for line in differences("wsync %s --json keys" % command,
                                                      printed, words)
                         if "missing from the page" in line]
            text = read_source("core", sources[command])
            problems += ["wsync %s --json: the page names the key %s, which core/%s does "
                         "not print" % (command, w, sources[command])
                         for w in sorted(words) if '"%s"' % w not in text]
        problems += check_verify_kinds(sections.get("verify", []), printed_kinds)
        problems += check_source_layouts(sections.get("plan", []), work, a, ranks, config)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return problems


def italic_words(lines):
    """The words set in italics by .I, .IR, .RI and \\fI of @lines."""
    words = []
    for line in lines:
        line = line.replace("\\-", "-")
        words += re.findall(r"\\fI(.*?)\\f[RPB]", line)
        macro, _, rest = line.partition(" ")
        try:
            args = shlex.split(rest)
        except ValueError:
            continue
        start = {".I": None, ".IR": 0, ".RI": 1}.get(macro, -1)
        if start is None:
            words += args
        elif start >= 0:
            words += args[start::2]
    return {w.strip(" ,;.()") for w in words}


def check_source_layouts(section, work, checkpoint, ranks, config):
    """plan --json's source_layout and source_format, for each kind of source (a Hugging
    Face checkpoint, rank files, a sharded training checkpoint through merge, generated
    weights through synth), are values plan's --json paragraph names in italics: the
    page says what they hold for each (a sharded checkpoint's "hf" and null read oddly
    without it)."""
    dcp = os.path.join(work, "dcp")
    shards = [f for f in sorted(os.listdir(checkpoint)) if f.endswith(".safetensors")]
    if len(shards) != 1:
        return ["%s: expected one safetensors file, found %s" % (checkpoint, shards)]
    made = subprocess.run([sys.executable, os.path.join(SRC, "make-dcp-fixtures.py"), "--shard",
                           os.path.join(checkpoint, shards[0]), dcp],
                          capture_output=True, text=True)
    if made.returncode != 0:
        return ["make-dcp-fixtures.py --shard: exit %d: %s" % (made.returncode, made.stderr)]
    runs = {"a Hugging Face checkpoint": ["plan", checkpoint, "--target", "vllm"],
            "rank files": ["plan", ranks, "--target", "hf"],
            "a sharded checkpoint": ["merge", os.path.join(dcp, "a"),
                                     os.path.join(work, "merged")],
            "generated weights": ["synth", "--config", config, os.path.join(work, "gen")]}
    named = italic_words(json_paragraph(section))
    problems = []
    for kind, argv in runs.items():
        r = wsync(*(argv + ["--json"]))
        if r.returncode != 0:
            problems.append("wsync %s --json: exit %d: %s" % (argv[0], r.returncode, r.stderr))
            continue
        data = json.loads(r.stdout)
        for key in ("source_layout", "source_format"):
            if data[key] is not None and data[key] not in named:
                problems.append("wsync %s --json of %s: %s %s is not named in plan's --json "
                                "paragraph" % (argv[0], kind, key, data[key]))
    return problems


def check_verify_kinds(section, printed_kinds):
    """Every kind of difference core/cmd-verify.c names (diff_kind_names, but "none",
    which --json prints as a null difference) is set in italics in verify's --json
    paragraph, and the runs made the kind of a name held by more files on one side."""
    kinds = set(re.findall(r'\[DIFF_[A-Z_]+\] = "([a-z-]+)"',
                           read_source("core", "cmd-verify.c"))) - {"none"}
    problems = [] if len(kinds) >= 7 else ["core/cmd-verify.c: found only the kinds %s"
                                           % sorted(kinds)]
    problems += ["wsync verify --json: the kind %s is not named in the verify section" % k
                 for k in sorted(kinds - italic_words(json_paragraph(section)))]
    problems += ["wsync verify --json: printed the kind %s, which core/cmd-verify.c does not "
                 "name" % k for k in sorted(printed_kinds - kinds)]
    if "file-count" not in printed_kinds:
        problems.append("wsync verify --json of rank files against their checkpoint: kinds "
                        "%s, not file-count" % sorted(printed_kinds))
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


# The options a command refuses to run without (exit 2), checked against the program by
# check_documented_invocations, so that a list that went stale fails too.  plan and
# convert are not here: their --target may come from conf.d's sync { } section.
REQUIRED_OPTIONS = {"env": ["--backend", "--mode"], "synth": ["--config"]}


def documented_invocations():
    """(where, command, text) for every `wsync COMMAND ...` code span of README.md,
    docs/*.md and the comments of conf.d/*.conf, and every line of the man pages'
    examples (.EX blocks) that runs wsync: what a user copies."""
    found = []
    root = os.path.join(SRC, "..")
    files = ["README.md"] + ["docs/" + n for n in sorted(os.listdir(os.path.join(root, "docs")))
                             if n.endswith(".md")]
    files += ["conf.d/" + n for n in sorted(os.listdir(os.path.join(root, "conf.d")))
              if n.endswith(".conf")]
    span = re.compile(r"`(?:mpirun [^`]*?)?wsync ([a-z]+)((?:[^`]|`(?!\s*\|))*?)`")
    for name in files:
        text = read_source(*name.split("/"))
        if name.endswith(".conf"):
            text = "\n".join(line for line in text.split("\n") if line.startswith("#"))
        for m in span.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(("%s:%d" % (name, line), m.group(1), m.group(2)))
    for page in ("wsync.1.in", "wsync.conf.5.in"):
        example = False
        for number, line in enumerate(read_source("man", page).split("\n"), 1):
            example = line == ".EX" or (example and line != ".EE")
            m = re.search(r"\bwsync ([a-z]+)(.*)", line.replace("\\-", "-")) if example else None
            if m:
                found.append(("man/%s:%d" % (page, number), m.group(1), m.group(2)))
    return found


def check_documented_invocations():
    """Every wsync invocation the docs show names a command `wsync --help` lists and only
    options `wsync COMMAND --help` lists (a short form for its long one), and one with
    arguments gives the options the command cannot run without: `wsync env --backend
    npu-ascend`, which exits 2 for want of --mode, was in README.md."""
    text = main_help()
    commands = {line.split()[0] for line in help_block(text, "Commands:")}
    global_options = options_of(help_block(text, "Options of every command:"))
    problems, options = [], {}
    for command in commands:
        if command == "sync" and os.environ.get("WSYNC_TEST_MPI") != "yes":
            continue
        lines = help_block(wsync(command, "--help").stdout, "Options:")
        options[command] = (options_of(lines) | global_options, dict(short_options(lines)))
    for command, required in REQUIRED_OPTIONS.items():
        for option in required:
            # every required option but this one, with a placeholder value
            argv = [command] + [a for o in required if o != option for a in (o, "x")]
            r = wsync(*argv)
            if r.returncode != 2 or option not in r.stderr:
                problems.append("REQUIRED_OPTIONS: wsync %s without %s: exit %d, %r (not a "
                                "refusal naming it)" % (command, option, r.returncode,
                                                        r.stderr.strip()))
    invocations = documented_invocations()
    if len(invocations) < 20:
        problems.append("found only %d documented invocations" % len(invocations))
    for where, command, args in invocations:
        if command not in commands:
            problems.append("%s: wsync %s: no such command" % (where, command))
            continue
        if command not in options:
            continue
        known, long_of = options[command]
        given = set(LONG_OPTION.findall(args))
        given |= {long_of.get(s, s) for s in re.findall(r"(?<![\w-])-[a-zA-Z](?![\w-])", args)}
        for option in sorted(given - known):
            problems.append("%s: wsync %s%s: %s is not an option of wsync %s"
                            % (where, command, args, option, command))
        if args.strip():
            for option in REQUIRED_OPTIONS.get(command, []):
                if option not in given:
                    problems.append("%s: wsync %s%s: without %s, which it needs (exit 2)"
                                    % (where, command, args, option))
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


# What configure.ac checks for, by the Debian 12 package that provides it; a check
# configure.ac gains without an entry here fails check_readme_packages, so that README's
# commands are brought along.
CONFIGURE_PACKAGES = {
    "glib-2.0": "libglib2.0-dev", "gthread-2.0": "libglib2.0-dev",
    "json-glib-1.0": "libjson-glib-dev", "libconfuse": "libconfuse-dev",
    "libzip": "libzip-dev", "libxxhash": "libxxhash-dev", "ltdl.h": "libltdl-dev",
    "ompi-c": "libopenmpi-dev", "mpicc": "openmpi-bin", "Python.h": "python3-dev",
    "AM_PATH_PYTHON": "python3", "valgrind": "valgrind",
}
# The build's tools (autoreconf -fi, libtool, a C compiler, make, pkg-config).
TOOLCHAIN = {"build-essential", "autoconf", "automake", "libtool", "pkg-config"}
# What only the tests use: make check-valgrind, groff -ww above, tests/test-python.py.
TEST_ONLY = {"valgrind", "groff-base", "python3-numpy"}


def readme_command(marker):
    """The packages `apt-get install -y` names in README.md's command after @marker."""
    with open(os.path.join(SRC, "..", "README.md"), encoding="utf-8") as f:
        text = f.read()
    block = text[text.index(marker):]
    block = block[block.index("```sh\n") + 6:]
    block = block[:block.index("```")]
    m = re.search(r"apt-get install -y ((?:[a-z0-9.+-]+ ?)+)", block)
    return set(m.group(1).split()) if m else set()


def check_readme_packages():
    """README's newcomer commands install exactly what the build needs (the toolchain and
    what configure.ac checks for), and the test command also what only the tests use."""
    configure = read_source("configure.ac")
    problems, needed = [], set(TOOLCHAIN)
    checked = set()
    for m in re.finditer(r"PKG_CHECK_MODULES\(\[\w+\], \[([^]]*)\]", configure):
        checked |= {w for w in m.group(1).split() if re.match(r"[A-Za-z]", w)}
    checked |= set(re.findall(r"AC_CHECK_HEADERS?\(\[([\w.]+\.h)\]", configure))
    checked |= set(re.findall(r"AC_PATH_PROG\(\[\w+\], \[([\w.-]+)\]", configure))
    checked |= {"AM_PATH_PYTHON"} if "AM_PATH_PYTHON(" in configure else set()
    for what in sorted(checked):
        if what in CONFIGURE_PACKAGES:
            needed.add(CONFIGURE_PACKAGES[what])
        elif not what.startswith("xxh_"):  # xxhash's optional dispatch header
            problems.append("configure.ac checks for %s, which tests/test-man.py cannot "
                            "name a package for (CONFIGURE_PACKAGES)" % what)
    if len(checked) < 8:
        problems.append("found only %s in configure.ac" % sorted(checked))
    build = needed - TEST_ONLY
    problems += differences("README.md's main command (apt-get install) against configure.ac",
                            build, readme_command("<!-- main-command -->"))
    problems += differences("README.md's test command (apt-get install) against configure.ac "
                            "and the tests", build | TEST_ONLY,
                            readme_command("<!-- test-command -->"))
    return [p.replace("missing from the page", "not installed")
            .replace("on the page but not in the program", "installed but not used")
            for p in problems]


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
        ("wsync.1: every environment variable, every value of WSYNC_TRANSPOSE",
         lambda: check_environment(wsync1)),
        ("wsync.1: the keys of verify, plan, plugins and env --json",
         lambda: check_json_keys(wsync1)),
        ("wsync.1: every key of inspect --json", lambda: check_inspect_json_keys(wsync1)),
        ("wsync.conf.5: the plugins' options as the plugins declare them",
         lambda: check_plugin_options(conf5)),
        ("wsync.conf.5: the sync section's keys", lambda: check_sync_keys(conf5)),
        ("README.md: the targets table lists every target", check_readme_targets),
        ("README.md: every command, exactly its options", check_readme_commands),
        ("README.md, docs/, conf.d and the man pages' examples: every wsync invocation "
         "runs as shown", check_documented_invocations),
        ("README.md: the newcomer commands install what the build and the tests use",
         check_readme_packages),
        ("wsync convert --help and the notes and refusals of plan cite docs/NAME.md §N",
         check_citations),
        ("every docs/NAME.md §N cited in README.md, docs/, man/, conf.d and the sources "
         "is a section of that file", check_citation_targets),
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

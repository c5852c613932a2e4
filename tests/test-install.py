#!/usr/bin/env python3
"""wsync as a distribution installs it, extended the way a user extends it:

`make install DESTDIR=...` of this build into a scratch directory, then, against that
installed tree only:

- the README and every docs/*.md (which notes, errors and --help cite) are installed in
  one documentation directory, and wsync(1) names it;
- every public header compiles on its own (twice in a row) with nothing but
  `pkg-config --cflags wsync`, and the headers installed are those of include/wsync/;
- examples/ (one .c file and a Makefile that knows only `pkg-config --cflags --libs
  wsync` and `pkg-config --variable=plugindir wsync`) builds a plugin that exports its
  two symbols and nothing else, and installs it into the plugin directory;
- selected by examples/60-dtype-key.conf in the installed conf.d, the installed wsync
  loads it beside the installed plugins: `wsync plugins --json` shows it active from
  that directory with its entry and its documented option;
- it does its job: `wsync config`, and `wsync convert` of a synthesised checkpoint by
  the installed plugins, write the dtype key it is configured for; a config it cannot
  patch is refused with one line and exit status 3.

The installed wsync.pc names the configured prefix; the scratch copy of it used here
names the same tree under DESTDIR (PKG_CONFIG_SYSROOT_DIR would also move the system's
own glib and json-glib flags under DESTDIR).  Runs after every other test
(Makefile.am): libtool relinks the build tree's plugins while it installs them.

Prints TAP.  Accepts and ignores --tap and -k (tests/tap-test passes them).
Environment: G_TEST_SRCDIR, G_TEST_BUILDDIR (AM_TESTS_ENVIRONMENT), WSYNC_TEST_MAKE,
WSYNC_TEST_CC."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # never write into the source tree (make distcheck)

SRC_TOP = os.path.normpath(os.path.join(os.environ.get("G_TEST_SRCDIR", "."), ".."))
BUILD_TOP = os.path.normpath(os.path.join(os.environ.get("G_TEST_BUILDDIR", "."), ".."))


class Failed(Exception):
    pass


def run(argv, cwd=None, env=None, check=True):
    """Runs @argv; with @check, a non-zero exit fails the case with its output."""
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise Failed("%s: exit %d\n%s%s" % (" ".join(shlex.quote(a) for a in argv),
                                             r.returncode, r.stdout, r.stderr))
    return r


def quiet_make_env():
    """The environment of a make of its own: not the jobserver of `make check`."""
    env = dict(os.environ)
    for name in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):
        env.pop(name, None)
    return env


def find(root, predicate):
    found = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(d, name)
            if predicate(path):
                found.append(path)
    return found


def expect(condition, message):
    if not condition:
        raise Failed(message)


class Installed:
    """The scratch tree: DESTDIR, and where things landed in it."""

    def __init__(self, work):
        self.work = work
        self.dest = os.path.join(work, "dest")
        self.pc_dir = os.path.join(work, "pkgconfig")
        self.libdir = None

    def install(self):
        make = os.environ.get("WSYNC_TEST_MAKE") or "make"
        run([make, "-s", "install", "DESTDIR=" + self.dest], cwd=BUILD_TOP,
            env=quiet_make_env())
        pcs = find(self.dest, lambda p: p.endswith("/pkgconfig/wsync.pc"))
        expect(len(pcs) == 1, "wsync.pc installed %d times: %s" % (len(pcs), pcs))
        self.relocate_pc(pcs[0])
        # (the relocated wsync.pc names them under DESTDIR)
        self.libdir = self.variable("libdir")
        self.includedir = self.variable("includedir")
        self.plugindir = self.variable("plugindir")
        expect(all(d.startswith(self.dest + "/") for d in
                   (self.libdir, self.includedir, self.plugindir)),
               "wsync.pc names directories outside DESTDIR")
        binaries = find(self.dest, lambda p: p.endswith("/bin/wsync"))
        expect(len(binaries) == 1, "bin/wsync installed %d times" % len(binaries))
        self.wsync_bin = binaries[0]
        confs = sorted({os.path.dirname(p) for p in
                        find(self.dest, lambda p: p.endswith(".conf") and
                             "/wsync/conf.d/" in p)})
        expect(len(confs) == 1, "conf.d installed in %d places" % len(confs))
        self.conf_dir = confs[0]

    def relocate_pc(self, pc):
        """A copy of the installed wsync.pc whose absolute directories are under DESTDIR."""
        os.makedirs(self.pc_dir)
        with open(pc, encoding="utf-8") as f:
            lines = f.read().split("\n")
        out = [re.sub(r"^(\w+)=/", lambda m: "%s=%s/" % (m.group(1), self.dest), line)
               for line in lines]
        with open(os.path.join(self.pc_dir, "wsync.pc"), "w", encoding="utf-8") as f:
            f.write("\n".join(out))

    def env(self):
        env = dict(quiet_make_env(), PKG_CONFIG_PATH=self.pc_dir, LC_ALL="C",
                   WSYNC_PLUGIN_PATH="")
        if self.libdir:
            env["LD_LIBRARY_PATH"] = self.libdir  # the installed binary's rpath is not here
        return env

    def pkg_config(self, *args):
        return run(["pkg-config"] + list(args) + ["wsync"], env=self.env()).stdout.strip()

    def variable(self, name):
        return self.pkg_config("--variable=" + name)

    def wsync(self, *args, check=True):
        return run([self.wsync_bin, "--conf-dir", self.conf_dir, "--plugin-dir",
                    self.plugindir] + list(args), env=self.env(), check=check)


# ------------------------------------------------------------------ the cases

def case_installed_tree(t):
    t.install()
    plugins = sorted(os.listdir(t.plugindir))
    expect(plugins and all(p.endswith(".so") for p in plugins),
           "the plugin directory holds more than plugins: %s" % plugins)
    expect(os.path.exists(os.path.join(t.libdir, "libwsync.so")), "no libwsync.so link")
    expect(find(t.dest, lambda p: re.search(r"/man1/wsync\.1$", p)) and
           find(t.dest, lambda p: re.search(r"/man5/wsync\.conf\.5$", p)),
           "the man pages are not installed")
    return ["%d plugins in %s" % (len(plugins), t.plugindir[len(t.dest):])]


def case_docs(t):
    """The notes, errors and --help of the installed program cite docs/NAME.md: every one
    of docs/ is installed, with the README, in one documentation directory, which
    wsync(1) names."""
    readmes = find(t.dest, lambda p: p.endswith("/README.md"))
    expect(len(readmes) == 1, "README.md installed %d times: %s" % (len(readmes), readmes))
    docdir = os.path.dirname(readmes[0])
    source = sorted(n for n in os.listdir(os.path.join(SRC_TOP, "docs")) if n.endswith(".md"))
    installed = sorted(os.listdir(os.path.join(docdir, "docs"))) \
        if os.path.isdir(os.path.join(docdir, "docs")) else []
    expect(installed == source, "%s/docs holds %s, docs/ has %s"
           % (docdir[len(t.dest):], installed, source))
    pages = find(t.dest, lambda p: re.search(r"/man1/wsync\.1$", p))
    with open(pages[0], encoding="utf-8") as f:
        page = f.read().replace("\\-", "-")
    expect(docdir[len(t.dest):] + "/docs" in page,
           "wsync(1) does not name %s/docs" % docdir[len(t.dest):])
    return ["%d in %s/docs" % (len(installed), docdir[len(t.dest):])]


def case_headers(t):
    cc = shlex.split(os.environ.get("WSYNC_TEST_CC") or "cc")
    cflags = shlex.split(t.pkg_config("--cflags"))
    expect(any(f == "-I" + t.includedir for f in cflags),
           "pkg-config --cflags does not name the installed headers: %s" % cflags)
    installed = sorted(os.listdir(os.path.join(t.includedir, "wsync")))
    source = sorted(n for n in os.listdir(os.path.join(SRC_TOP, "include", "wsync"))
                    if n.endswith(".h"))
    expect(installed == source, "installed headers %s, include/wsync/ has %s"
           % (installed, source))
    for header in installed:
        unit = os.path.join(t.work, "alone.c")
        with open(unit, "w", encoding="utf-8") as f:
            f.write("#include <wsync/%s>\n#include <wsync/%s>\n" % (header, header))
        run(cc + ["-std=c11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"] + cflags +
            [unit], env=t.env())
    return ["%d headers" % len(installed)]


def case_example_builds(t):
    t.example = os.path.join(t.work, "examples")
    shutil.copytree(os.path.join(SRC_TOP, "examples"), t.example)
    make = os.environ.get("WSYNC_TEST_MAKE") or "make"
    env = t.env()
    env["CC"] = os.environ.get("WSYNC_TEST_CC") or "cc"
    run([make, "-s"], cwd=t.example, env=env)
    nm = run(["nm", "-D", "--defined-only", os.path.join(t.example, "dtype-key.so")])
    exported = sorted(line.split()[-1] for line in nm.stdout.split("\n") if line.strip())
    expect(exported == ["wsync_plugin_descriptor", "wsync_plugin_register"],
           "dtype-key.so exports %s" % exported)
    run([make, "-s", "install"], cwd=t.example, env=env)
    expect(os.path.isfile(os.path.join(t.plugindir, "dtype-key.so")),
           "make install did not put dtype-key.so into %s" % t.plugindir)
    return []


def case_plugins_json(t):
    shutil.copy(os.path.join(t.example, "60-dtype-key.conf"), t.conf_dir)
    r = t.wsync("plugins", "--json")
    expect(r.stderr == "", "stderr: %s" % r.stderr)
    plugins = {p["name"]: p for p in json.loads(r.stdout)["plugins"]}
    not_active = ["%s (%s)" % (n, p["reason"]) for n, p in plugins.items()
                  if p["state"] != "active"]
    expect(not not_active, "not active: %s" % not_active)
    p = plugins.get("dtype-key")
    expect(p is not None, "dtype-key is not listed: %s" % sorted(plugins))
    expect(p["path"] == os.path.join(t.plugindir, "dtype-key.so"), "path %s" % p["path"])
    expect(p["description"] == "config.json names the dtype as torch_dtype or dtype",
           "description %r" % p["description"])
    expect(p["entries"] == [{"kind": "config-patcher", "name": "dtype-key", "priority": 0,
                             "serves": None}], "entries %s" % p["entries"])
    expect(p["options"] == [{
        "name": "key", "type": "string", "list": False, "default": "torch_dtype",
        "values": '"torch_dtype" or "dtype"',
        "description": "The key config.json names the model's dtype with: torch_dtype is "
                       "read by Transformers 4 and 5, dtype only by Transformers 5."}],
        "options %s" % p["options"])
    return ["active beside %s" % ", ".join(sorted(n for n in plugins if n != "dtype-key"))]


def case_patches(t):
    config = os.path.join(t.work, "config.json")
    with open(config, "w", encoding="utf-8") as f:
        f.write('{"model_type": "qwen3", "dtype": "bfloat16", "vocab_size": 8,\n'
                ' "text_config": {"dtype": "float32", "torch_dtype": "float32"}}\n')
    r = t.wsync("config", config)
    expect(r.stdout == '{\n  "model_type" : "qwen3",\n  "torch_dtype" : "bfloat16",\n'
                      '  "vocab_size" : 8,\n  "text_config" : {\n'
                      '    "torch_dtype" : "float32"\n  }\n}\n', "wsync config: %s" % r.stdout)
    with open(config, "w", encoding="utf-8") as f:
        f.write('{"model_type": "qwen3", "dtype": "bfloat16", "torch_dtype": "float16"}\n')
    r = t.wsync("config", config, check=False)
    expect(r.returncode == 3 and r.stdout == "" and r.stderr ==
           'wsync: config patcher "dtype-key" (plugin "dtype-key"): torch_dtype is "float16" '
           'but dtype is "bfloat16": which one is the model\'s dtype?\n',
           "a conflict: exit %d, stderr %r" % (r.returncode, r.stderr))
    return []


def case_convert(t):
    with open(os.path.join(t.conf_dir, "70-dtype-key.conf"), "w", encoding="utf-8") as f:
        f.write('plugin "dtype-key" {\n    key = "dtype"\n}\n')
    hf = os.path.join(t.work, "hf")
    out = os.path.join(t.work, "vllm-tp2")
    t.wsync("-q", "synth", "--config", os.path.join(SRC_TOP, "configs", "tiny-qwen3-moe.json"),
            hf)
    t.wsync("-q", "convert", hf, out, "--target", "vllm", "--tp", "2")
    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
        written = json.load(f)
    keys = list(written)
    expect("dtype" in written and "torch_dtype" not in written and
           written["dtype"] == "bfloat16", "config.json of convert: %s" % written)
    with open(os.path.join(SRC_TOP, "configs", "tiny-qwen3-moe.json"), encoding="utf-8") as f:
        source_keys = list(json.load(f))
    expect(keys.index("dtype") == source_keys.index("torch_dtype"),
           "dtype moved from its place: %s" % keys)
    expect(sorted(os.listdir(out)).count("model-rank-1-part-0.safetensors") == 1,
           "no rank 1 file: %s" % sorted(os.listdir(out)))
    return []


CASES = [
    ("make install DESTDIR: library, headers, wsync.pc, command, plugins (no .la), conf.d, "
     "man pages", case_installed_tree),
    ("the README and every docs/*.md the program cites, in the directory wsync(1) names",
     case_docs),
    ("every installed header compiles alone with pkg-config --cflags wsync", case_headers),
    ("examples/ builds and installs with pkg-config only; dtype-key.so exports 2 symbols",
     case_example_builds),
    ("selected in conf.d: wsync plugins --json shows dtype-key active, its entry and option",
     case_plugins_json),
    ("wsync config through dtype-key; a conflict is one line, exit 3", case_patches),
    ("wsync convert by the installed plugins writes config.json with key = \"dtype\"",
     case_convert),
]


def main(argv):
    for arg in argv[1:]:
        if arg not in ("--tap", "-k"):
            print("usage: %s [--tap] [-k]" % argv[0], file=sys.stderr)
            return 2
    work = tempfile.mkdtemp(prefix="wsync-test-install-")
    t = Installed(work)
    failures = 0
    print("1..%d" % len(CASES))
    try:
        for number, (name, case) in enumerate(CASES, 1):
            if failures:
                print("not ok %d - %s # (not run: an earlier case failed)" % (number, name))
                continue
            try:
                notes = case(t)
                print("ok %d - %s" % (number, name))
            except Failed as e:
                failures += 1
                print("not ok %d - %s" % (number, name))
                notes = str(e).rstrip("\n").split("\n")
            for line in notes:
                print("# " + line)
            sys.stdout.flush()
    finally:
        if not os.environ.get("WSYNC_TEST_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

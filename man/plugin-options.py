#!/usr/bin/env python3
"""The PLUGINS section of wsync.conf(5), made from `wsync plugins --json`.

Each plugin's description and options come from the plugin itself: its descriptor and
its libconfuse option table, each option documented in its `comment`
(WSYNC_OPTION_DOC(), include/wsync/plugin.h).  So the page cannot drift from the code:
tests/test-man.py renders this section from the built plugins and compares it with the
page, and `make update-man` rewrites the page's section in place.

    plugin-options.py JSON_FILE               print the section
    plugin-options.py JSON_FILE --update PAGE rewrite the section of PAGE (wsync.conf.5.in)

Standard library only.  An option without a description is an error: every option a
plugin of this tree declares must say what it does.
"""

import json
import re
import sys

BEGIN = ".\\\" BEGIN PLUGIN OPTIONS"
END = ".\\\" END PLUGIN OPTIONS"


class Undocumented(Exception):
    pass


def roff_text(text):
    """@text as a line of roff: backslashes escaped, a leading . or ' neutralised, and
    each hyphen that begins an option (--tp, -q) a minus sign so it can be copied."""
    text = text.replace("\\", "\\e")
    text = re.sub(r"(?<![\w-])-(?=[-\w])", r"\\-", text)
    text = re.sub(r"(?<=\\-)-", r"\\-", text)
    if text[:1] in (".", "'"):
        text = "\\&" + text
    return text


def roff_code(text):
    """@text (a name or a value) in roff with every hyphen a minus sign."""
    return text.replace("\\", "\\e").replace("-", "\\-")


def conf_value(value):
    """One value as a conf.d file writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"%s"' % value.replace("\\", "\\\\").replace('"', '\\"')
    return repr(value)


def default_text(option):
    value = option["default"]
    if value is None:
        return None
    if option["list"]:
        return "{%s}" % ", ".join(conf_value(v) for v in value)
    return conf_value(value)


def option_block(plugin, option):
    if not (option.get("description") or "").strip():
        raise Undocumented('plugin "%s": option "%s" has no description (WSYNC_OPTION_DOC() '
                           "in its comment)" % (plugin["name"], option["name"]))
    kind = option["type"] + (" list" if option["list"] else "")
    default = default_text(option)
    if default is None:
        tag = "\\fB%s\\fR (%s, no default)" % (roff_code(option["name"]), kind)
    else:
        tag = "\\fB%s\\fR (%s, default \\fB%s\\fR)" % (roff_code(option["name"]), kind,
                                                      roff_code(default))
    values = option["values"].rstrip(".")
    return [".TP", tag, roff_text(option["description"]), ".br",
            roff_text("Values: %s." % values)]


def plugin_block(plugin):
    """The lines of one plugin: its name, description and options."""
    description = (plugin["description"] or "").rstrip(".") + "."
    lines = [".SS %s" % roff_code(plugin["name"]), roff_text(description)]
    options = plugin.get("options") or []
    if not options:
        lines.append("It has no options.")
    for option in options:
        lines += option_block(plugin, option)
    return "\n".join(lines) + "\n"


def blocks(plugins_json):
    """{name: block} of every active or disabled plugin of `wsync plugins --json`."""
    return {p["name"]: plugin_block(p) for p in plugins_json["plugins"]
            if p["state"] in ("active", "disabled")}


def section(plugins_json):
    return "".join(b for _, b in sorted(blocks(plugins_json).items()))


def split_page(text):
    """(before, the section, after) of a page, the marks staying outside the section."""
    begin = text.index(BEGIN)
    begin = text.index("\n", begin) + 1
    end = text.index(END, begin)
    return text[:begin], text[begin:end], text[end:]


def page_blocks(text):
    """{name: block} of the section of a page, as plugin_block() writes them."""
    _, body, _ = split_page(text)
    found = {}
    for chunk in re.split(r"(?m)^(?=\.SS )", body):
        if chunk.startswith(".SS "):
            name = chunk.split("\n", 1)[0][4:].replace("\\-", "-")
            found[name] = chunk
    return found


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--update"):
        print("usage: %s JSON_FILE [--update PAGE]" % argv[0], file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        plugins_json = json.load(f)
    try:
        text = section(plugins_json)
    except Undocumented as e:
        print("%s: %s" % (argv[0], e), file=sys.stderr)
        return 1
    if len(argv) == 2:
        sys.stdout.write(text)
        return 0
    with open(argv[3], encoding="utf-8") as f:
        before, _, after = split_page(f.read())
    with open(argv[3], "w", encoding="utf-8") as f:
        f.write(before + text + after)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

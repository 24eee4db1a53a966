"""The shape bounds of src/ (issue 39, docs/design.md "Components, not a method per
feature") hold: no class has more than MAX_METHODS member functions defined out of line
(constructors and destructors aside; an overload set counts once) nor spreads them
over more than MAX_FILES source files, and no function in a .cc file is longer than
MAX_LINES lines unless the comment right above it says why ("Long because ..."
or "... on purpose: ...").
Reads the sources only; needs no build.

A class that outgrows the bound is split into components that own their state (the
way the server's RangeStore, replication and held requests are), not spread over one
more file."""
import collections
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
SRC = os.path.join(ROOT, 'src')

MAX_METHODS = 27  # the "~25"
MAX_FILES = 3
MAX_LINES = 80
REASON = re.compile(r'\bLong because\b|\bon purpose\b')


def strip_code(text):
    """`text` with comments, string and character literals blanked (newlines kept),
    so braces and parentheses inside them do not count."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(')' + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif c in '"\'' and not (c == "'" and i > 0 and text[i - 1].isalnum()):
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == '\\' else 1
            j = min(j + 1, n)
            out.append(c + ' ' * (j - i - 2) + c if j - i >= 2 else ' ' * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    # Preprocessor lines (with their continuations) are not code either.
    return re.sub(r'(?m)^[ \t]*#(?:[^\n]*\\\n)*[^\n]*', lambda m: re.sub(r'[^\n]', ' ', m.group(0)),
                  ''.join(out))


def functions(path):
    """(class or None, name, first line, last line) of every function defined at
    namespace scope in the file `path`, and its lines."""
    return functions_in(open(path, encoding='utf-8').read())


def functions_in(raw):
    """functions() of the source text `raw`."""
    code = strip_code(raw)
    found, kinds, stmt = [], [], 0
    open_fn = None  # (cls, name, start line, depth at open)
    for i, c in enumerate(code):
        at_ns = all(k == 'ns' for k in kinds)
        if c in ';}' and at_ns:
            stmt = i + 1
        if c == '{':
            if at_ns:
                head = code[stmt:i].strip()
                if re.match(r'(inline\s+)?namespace\b|extern\s+"', head) or head.startswith(
                        'extern'):
                    kinds.append('ns')
                    stmt = i + 1
                    continue
                before = head.split('(')[0] if '(' in head else ''
                name = re.search(r'(?:(\w+)(?:<[^<>]*>)?::)?(~?\w+)\s*$', before)
                if name and not re.match(r'(class|struct|enum|union)\b', head) and (
                        '=' not in before):
                    line = raw.count('\n', 0, stmt + (len(code[stmt:i]) -
                                                      len(code[stmt:i].lstrip()))) + 1
                    open_fn = (name.group(1), name.group(2), line, len(kinds))
            kinds.append('other')
        elif c == '}' and kinds:
            kinds.pop()
            if open_fn and len(kinds) == open_fn[3]:
                found.append((open_fn[0], open_fn[1], open_fn[2], raw.count('\n', 0, i) + 1))
                open_fn = None
            if all(k == 'ns' for k in kinds):
                stmt = i + 1
    return found, raw.splitlines()


def sources():
    for d, _, names in os.walk(SRC):
        for name in sorted(names):
            if name.endswith('.cc'):
                yield os.path.join(d, name)


def has_reason(lines, first):
    """The comment block ending right above line `first` (1-based) states a reason."""
    j = first - 2
    block = []
    while j >= 0 and lines[j].strip().startswith(('//', '*', '/*')):
        block.append(lines[j])
        j -= 1
    return bool(REASON.search(' '.join(block)))


SAMPLE = """#include "x.h"
#define BRACE {
namespace pskv {
namespace {
int Free(int a) { return a; }  // "{"
}  // namespace
std::vector<int> Node::Ids(
    int a,
    const char* s = "(")
    const {
  auto f = [&] { return '{'; };
  return {};
}
// Long because it is one switch.
void Node::Dispatch() {
%s}
void Node::Plain() {
%s}
class Local {
  void Inline() {}
};
}  // namespace pskv
""" % ('  x();\n' * 90, '  x();\n' * 90)


def test_the_parser_finds_definitions_reasons_and_lengths():
    found, lines = functions_in(SAMPLE)
    by_name = {n: (c, first, last) for c, n, first, last in found}
    assert set(by_name) == {'Free', 'Ids', 'Dispatch', 'Plain'}
    assert by_name['Free'] == (None, 5, 5)
    assert by_name['Ids'] == ('Node', 7, 13)
    assert by_name['Dispatch'][0] == 'Node' and has_reason(lines, by_name['Dispatch'][1])
    c, first, last = by_name['Plain']
    assert last - first + 1 == 92 and not has_reason(lines, first)


def test_the_parser_reads_the_real_sources():
    found, _ = functions(os.path.join(SRC, 'ps', 'scheduler.cc'))
    assert sum(1 for c, _, _, _ in found if c == 'Scheduler') >= 5


def test_no_class_is_spread_over_many_files_with_many_methods():
    methods = collections.defaultdict(set)
    files = collections.defaultdict(set)
    for path in sources():
        for cls, name, _, _ in functions(path)[0]:
            if cls and name.lstrip('~') != cls:  # constructors and destructors aside
                methods[cls].add(name)
                files[cls].add(os.path.relpath(path, SRC))
    over = [f'{c}: {len(methods[c])} methods in {len(files[c])} files {sorted(files[c])}'
            for c in methods if len(methods[c]) > MAX_METHODS or len(files[c]) > MAX_FILES]
    assert not over, ('classes past the bound (split them into components that own '
                      'their state):\n' + '\n'.join(over))


def test_no_long_function_without_a_stated_reason():
    long = []
    for path in sources():
        found, lines = functions(path)
        for cls, name, first, last in found:
            if last - first + 1 > MAX_LINES and not has_reason(lines, first):
                long.append(f'{os.path.relpath(path, ROOT)}:{first} '
                            f'{cls + "::" if cls else ""}{name}: {last - first + 1} lines')
    assert not long, (f'functions over {MAX_LINES} lines without a "Long because" comment '
                      'above them (split them, or say why not):\n' + '\n'.join(long))

#!/usr/bin/env python3
"""Check the structure of a Rust Cargo workspace (standard library only).

Usage: python3 check_structure.py ROOT [--max-lines 700] [--graph]

Checks every crate ROOT/*/src (and ROOT/src, if present):
  1. `*.rs` files longer than --max-lines lines.
  2. Import cycles between the files of one crate. File A -> file B when A names, through a path, an item
     defined in B (re-exports followed to the defining file). Path based: `use` trees and inline
     `crate::`/`super::`/`self::`/`<imported or child module>::` paths, after stripping comments, string and
     char literals and `#[cfg(test)]` items. Method calls, bare names brought in by globs, macros' bodies
     and trait-method dispatch are invisible to it.

Prints findings; the last line is `structure: N files, M problems`. Exit status 1 if any problem, else 0.
Each oversized file and each distinct cycle printed counts as one problem.
"""

import argparse
import bisect
import os
import re
import sys
from collections import deque

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"

# --------------------------------------------------------------------------------------------------------------
# Lexing helpers
# --------------------------------------------------------------------------------------------------------------


def _blank(s):
    """Same length as s, every character but newlines turned into a space."""
    return "".join("\n" if c == "\n" else " " for c in s)


def strip_comments_and_strings(text):
    """Comments, string/byte/raw/C string literals and char literals become spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(_blank(text[i:j]))
            i = j
            continue
        if c == "/" and nxt == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(_blank(text[i:j]))
            i = j
            continue
        prev_ident = i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")
        # raw strings: r"..", r#".."#, br"..", cr".."
        m = None if prev_ident else re.match(r'(?:b|c)?r(#*)"', text[i:i + 300])
        if m:
            close = '"' + m.group(1)
            j = text.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append(_blank(text[i:j]))
            i = j
            continue
        if c == '"' or (c in "bc" and nxt == '"' and not prev_ident):
            j = i + (2 if c != '"' else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(_blank(text[i:j]))
            i = j
            continue
        if c == "'" or (c == "b" and nxt == "'" and not prev_ident):
            k = i + (1 if c == "'" else 2)
            if k < n and text[k] == "\\":  # escaped char literal
                j = k + 1
                while j < n and text[j] != "'" and text[j] != "\n":
                    j += 1
                if j < n and text[j] == "'":
                    out.append(_blank(text[i:j + 1]))
                    i = j + 1
                    continue
            elif k + 1 < n and text[k + 1] == "'" and text[k] != "\n":  # 'x'
                out.append(_blank(text[i:k + 2]))
                i = k + 2
                continue
            out.append(c)  # a lifetime or label
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def match_brace(code, open_pos):
    """Index just past the `}` matching the `{` at open_pos (or len(code))."""
    depth = 0
    for j in range(open_pos, len(code)):
        ch = code[j]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
ATTR = re.compile(r"\s*#\s*\[[^\]]*\]")
VIS = r"(?:pub\s*(?:\([^)]*\))?\s*)?"


def remove_test_items(code):
    """Blank `#[cfg(test)]` modules (inline), fns, impls and uses. Returns (code, names of `#[cfg(test)] mod x;`)."""
    test_mod_decls = set()
    pos = 0
    while True:
        m = CFG_TEST.search(code, pos)
        if not m:
            break
        j = m.end()
        while True:  # further attributes
            a = ATTR.match(code, j)
            if not a:
                break
            j = a.end()
        rest = code[j:j + 400]
        end = None
        md = re.match(r"\s*" + VIS + r"mod\s+(" + IDENT + r")\s*([;{])", rest)
        if md:
            if md.group(2) == ";":
                test_mod_decls.add(md.group(1))
                end = j + md.end()
            else:
                end = match_brace(code, j + md.end() - 1)
        elif re.match(r"\s*" + VIS + r"use\b", rest):
            semi = code.find(";", j)
            end = len(code) if semi < 0 else semi + 1
        elif re.match(r"\s*" + VIS + r"(?:(?:const|async|unsafe|extern(?:\s*\"[^\"]*\")?)\s+)*fn\b|\s*(?:unsafe\s+)?impl\b",
                      rest):
            brace = code.find("{", j)
            end = len(code) if brace < 0 else match_brace(code, brace)
        if end is None:
            pos = m.end()
            continue
        code = code[:m.start()] + _blank(code[m.start():end]) + code[end:]
        pos = end
    return code, test_mod_decls


# --------------------------------------------------------------------------------------------------------------
# Per-file analysis
# --------------------------------------------------------------------------------------------------------------

USE_RE = re.compile(r"(?<![A-Za-z0-9_$])(pub\s*(?:\([^)]*\))?\s*)?use\s+([^;]*);")
USE_TOKEN = re.compile(r"\$?r?#?[A-Za-z_][A-Za-z0-9_]*|::|[{},*]")
DEF_RE = re.compile(r"(?<![A-Za-z0-9_])(?:struct|enum|union|trait|type|const|static|fn|mod)\s+(?:mut\s+)?(?:r#)?("
                    + IDENT + r")|(?<![A-Za-z0-9_])macro_rules!\s*(" + IDENT + r")")
MOD_DECL_RE = re.compile(r"(?<![A-Za-z0-9_])" + VIS + r"mod\s+(" + IDENT + r")\s*;")
PATH_RE = re.compile(r"(?<![A-Za-z0-9_$:.])(\$?" + IDENT + r"(?:\s*::\s*" + IDENT + r")+)")


class UseLeaf:
    __slots__ = ("segs", "name", "glob", "pos", "public")

    def __init__(self, segs, name, glob, pos, public):
        self.segs, self.name, self.glob, self.pos, self.public = segs, name, glob, pos, public


def parse_use_tree(body, base_pos, public):
    toks = [(m.group(0), base_pos + m.start()) for m in USE_TOKEN.finditer(body)]
    leaves = []

    def tree(i, prefix):
        segs = list(prefix)
        if i < len(toks) and toks[i][0] == "::":
            if not segs:
                segs.append("::")  # leading `::`: an external crate
            i += 1
        while i < len(toks):
            t, p = toks[i]
            if t == "{":
                i += 1
                while i < len(toks) and toks[i][0] != "}":
                    if toks[i][0] == ",":
                        i += 1
                        continue
                    i = tree(i, segs)
                return i + 1
            if t == "*":
                leaves.append(UseLeaf(tuple(segs), None, True, p, public))
                return i + 1
            if t in (",", "}", "::"):
                return i
            segs.append(t[2:] if t.startswith("r#") else t)
            last_pos = p
            i += 1
            if i < len(toks) and toks[i][0] == "::":
                i += 1
                continue
            name = segs[-1]
            if name == "self" and len(segs) > 1:
                segs.pop()
                name = segs[-1]
            if i + 1 < len(toks) and toks[i][0] == "as":
                name = toks[i + 1][0]
                i += 2
            leaves.append(UseLeaf(tuple(segs), name, False, last_pos, public))
            return i
        return i

    i = 0
    while i < len(toks):
        j = tree(i, ())
        i = j if j > i else i + 1
    return leaves


class FileInfo:
    def __init__(self, root, rel):
        self.rel = rel
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            self.text = fh.read()
        self.lines = self.text.count("\n") + (1 if self.text and not self.text.endswith("\n") else 0)
        self.nl = [i for i, ch in enumerate(self.text) if ch == "\n"]
        stripped = strip_comments_and_strings(self.text)
        self.code, self.test_mod_decls = remove_test_items(stripped)
        # brace scan: which positions are at item level (inside nothing but `mod x { }` blocks)
        events, stack = [], []
        for m in re.finditer(r"[{}]", self.code):
            if m.group(0) == "{":
                mm = re.search(r"(?<![A-Za-z0-9_])mod\s+(" + IDENT + r")\s*$", self.code[max(0, m.start() - 200):m.start()])
                stack.append(mm.group(1) if mm else None)
            elif stack:
                stack.pop()
            events.append((m.start(), tuple(stack)))
        self._ev_pos = [e[0] for e in events]
        self._ev_stack = [e[1] for e in events]
        self.defs = {}  # item-level name -> position
        for m in DEF_RE.finditer(self.code):
            name = m.group(1) or m.group(2)
            if self.mod_context(m.start()) is not None:
                self.defs.setdefault(name, m.start())
        self.mod_decls = []  # (name, inline mod names around it)
        for m in MOD_DECL_RE.finditer(self.code):
            ctx = self.mod_context(m.start())
            if ctx is not None:
                self.mod_decls.append((m.group(1), ctx))
        self.uses = []
        self.use_spans = []
        for m in USE_RE.finditer(self.code):
            self.uses.extend(parse_use_tree(m.group(2), m.start(2), bool(m.group(1))))
            self.use_spans.append((m.start(), m.end()))
        code_wo_uses = list(self.code)
        for a, b in self.use_spans:
            code_wo_uses[a:b] = _blank(self.code[a:b])
        self.code_wo_uses = "".join(code_wo_uses)
        # for bare-name searches: without attributes either (`#[derive(Copy)]` names a macro, not an item)
        bare = self.code_wo_uses
        for m in reversed(list(re.finditer(r"#\s*!?\s*\[", bare))):
            depth, j = 0, m.end() - 1
            while j < len(bare):
                if bare[j] == "[":
                    depth += 1
                elif bare[j] == "]":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            bare = bare[:m.start()] + _blank(bare[m.start():j + 1]) + bare[j + 1:]
        self.code_bare = MOD_DECL_RE.sub(lambda m: _blank(m.group(0)), bare)
        self.imports = {}  # name -> [UseLeaf]
        self.globs = []
        for u in self.uses:
            if u.glob:
                self.globs.append(u)
            elif u.name != "_":
                self.imports.setdefault(u.name, []).append(u)

    def mod_context(self, pos):
        """Names of inline `mod` blocks enclosing pos, or None when pos is inside any other braces."""
        k = bisect.bisect_right(self._ev_pos, pos) - 1
        st = self._ev_stack[k] if k >= 0 else ()
        if any(s is None for s in st):
            return None
        return st

    def line_of(self, pos):
        return bisect.bisect_left(self.nl, pos) + 1


# --------------------------------------------------------------------------------------------------------------
# Crate model and resolution
# --------------------------------------------------------------------------------------------------------------


class Crate:
    def __init__(self, root, crate_dir, files):
        self.root, self.dir = root, crate_dir
        self.files = files  # rel -> FileInfo
        self.modules = {}  # ns -> {modpath tuple: rel}
        self.where = {}  # rel -> (ns, modpath)
        self.test_only = set()
        src = os.path.join(crate_dir, "src")
        roots = []
        for name, ns in (("lib.rs", "lib"), ("main.rs", "main")):
            rel = os.path.join(src, name)
            if rel in files:
                roots.append((rel, ns))
        bindir = os.path.join(src, "bin")
        for rel in sorted(files):
            if os.path.dirname(rel) == bindir:
                roots.append((rel, "bin:" + rel))
            elif os.path.basename(rel) == "main.rs" and os.path.dirname(os.path.dirname(rel)) == bindir:
                roots.append((rel, "bin:" + rel))
        for rel, ns in roots:
            self.modules.setdefault(ns, {})
            self._walk(rel, ns, (), is_root=True, test=False)
        # files no `mod` declaration reaches: map them by their path into the main namespace
        main_ns = roots[0][1] if roots else "lib"
        self.modules.setdefault(main_ns, {})
        for rel in sorted(files):
            if rel in self.where or rel in self.test_only:
                continue
            sub = os.path.relpath(rel, src)
            parts = sub[:-3].split(os.sep)
            if parts[-1] == "mod":
                parts = parts[:-1]
            mp = tuple(parts)
            if mp not in self.modules[main_ns]:
                self.modules[main_ns][mp] = rel
                self.where[rel] = (main_ns, mp)

    def _walk(self, rel, ns, modpath, is_root, test):
        if test:
            self.test_only.add(rel)
        elif rel not in self.where:
            self.where[rel] = (ns, modpath)
            self.modules[ns].setdefault(modpath, rel)
        else:
            return
        info = self.files[rel]
        base = os.path.dirname(rel)
        if not (is_root or os.path.basename(rel) == "mod.rs"):
            base = os.path.join(base, os.path.basename(rel)[:-3])
        decls = [(n, ctx, False) for n, ctx in info.mod_decls] + [(n, (), True) for n in info.test_mod_decls]
        for name, ctx, is_test in decls:
            d = os.path.join(base, *ctx) if ctx else base
            for cand in (os.path.join(d, name + ".rs"), os.path.join(d, name, "mod.rs")):
                if cand in self.files:
                    self._walk(cand, ns, modpath + tuple(ctx) + (name,), False, test or is_test)
                    break

    # -- resolution -------------------------------------------------------------------------------------------

    def absolutize(self, rel, segs, guard=0):
        """Absolute module path (tuple, without `crate`) of a path written in file rel, or None if external."""
        if not segs or guard > 16:
            return None
        ns, mp = self.where[rel]
        info = self.files[rel]
        first = segs[0]
        if first in ("crate", "$crate"):
            return tuple(segs[1:])
        if first in ("self", "super"):
            base, k = mp, 0
            if first == "self":
                k = 1
            while k < len(segs) and segs[k] == "super":
                if not base:
                    return None
                base, k = base[:-1], k + 1
            return base + tuple(segs[k:])
        if first == "::" or first.startswith("$"):
            return None
        if mp + (first,) in self.modules[ns]:  # a child module
            return mp + tuple(segs)
        for u in info.imports.get(first, ()):
            if u.segs and u.segs[0] == first and len(u.segs) == 1:
                continue  # `use foo;` of an external crate
            target = self.absolutize(rel, u.segs, guard + 1)
            if target is not None:
                return target + tuple(segs[1:])
            return None
        if first in info.defs and len(segs) > 1:  # e.g. an enum of this file
            return mp + tuple(segs)
        return None

    def resolve(self, ns, path, strict=False, guard=0):
        """The file defining the item named by an absolute path, or None."""
        if guard > 24:
            return None
        mods = self.modules[ns]
        k = 0
        for i in range(len(path) + 1):
            if tuple(path[:i]) in mods:
                k = i
        mp = tuple(path[:k])
        rel = mods.get(mp)
        if rel is None:
            return None
        if k == len(path):
            return rel
        name = path[k]
        info = self.files[rel]
        if name in info.defs:
            return rel
        for u in info.imports.get(name, ()):
            target = self.absolutize(rel, u.segs)
            if target is None:
                return None  # re-export of an external crate
            return self.resolve(ns, target + tuple(path[k + 1:]), strict, guard + 1)
        for g in info.globs:
            target = self.absolutize(rel, g.segs)
            if target is None or target not in mods:
                continue
            r = self.resolve(ns, target + tuple(path[k:]), True, guard + 1)
            if r is not None:
                return r
        return None if strict else rel

    def edges(self):
        """{src: {dst: (line, text)}} for the files of this crate (test-only files excluded)."""
        out = {}
        for rel, info in self.files.items():
            if rel not in self.where or rel in self.test_only:
                continue
            ns, mp = self.where[rel]
            found = {}

            def add(dst, pos, text):
                if dst is None or dst == rel or dst in self.test_only:
                    return
                line = info.line_of(pos)
                if dst not in found or line < found[dst][0]:
                    found[dst] = (line, text)

            for u in info.uses:
                target = self.absolutize(rel, u.segs)
                if target is None:
                    continue
                dst = self.resolve(ns, target)
                written = "::".join(u.segs) + ("::*" if u.glob else "")
                if not u.public:
                    add(dst, u.pos, "use " + written)
                    continue
                # a re-export is not a use; a use of the re-exported name in this file is
                if u.glob:
                    if target not in self.modules[ns]:
                        continue
                    tinfo = self.files[self.modules[ns][target]]
                    names = list(tinfo.defs) + [n for n, us in tinfo.imports.items() if any(x.public for x in us)]
                    for n in names:
                        m = re.search(r"(?<![A-Za-z0-9_:.$])" + re.escape(n) + r"(?![A-Za-z0-9_]|\s*::)", info.code_bare)
                        if m:
                            add(self.resolve(ns, target + (n,)), m.start(), f"{n} (through `pub use {written}`)")
                elif u.name:
                    m = re.search(r"(?<![A-Za-z0-9_:.$])" + re.escape(u.name) + r"(?![A-Za-z0-9_]|\s*::)", info.code_bare)
                    if m:
                        add(dst, m.start(), f"{u.name} (through `pub use {written}`)")
            for m in PATH_RE.finditer(info.code_wo_uses):
                segs = [s.strip() for s in m.group(1).split("::")]
                if segs[0] not in ("crate", "$crate", "self", "super"):
                    if segs[0] in info.defs and mp + (segs[0],) not in self.modules[ns]:
                        continue  # an item of this file, e.g. `Kind::A`
                target = self.absolutize(rel, segs)
                if target is None:
                    continue
                add(self.resolve(ns, target), m.start(1), "::".join(segs))
            out[rel] = found
        return out


# --------------------------------------------------------------------------------------------------------------
# Graph algorithms
# --------------------------------------------------------------------------------------------------------------


def tarjan(nodes, adj):
    index, low, on, stack, sccs = {}, {}, set(), [], []
    counter = [0]
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(adj.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(adj.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                sccs.append(sorted(comp))
    return sccs


def cycles_of(comp, adj):
    """Shortest cycles through the edges of the component, enough of them that every edge is in one."""
    members = set(comp)
    seen, result = set(), []
    for u in comp:
        for v in sorted(adj.get(u, ())):
            if v not in members:
                continue
            prev, q = {v: None}, deque([v])
            while q and u not in prev:
                x = q.popleft()
                for y in sorted(adj.get(x, ())):
                    if y in members and y not in prev:
                        prev[y] = x
                        q.append(y)
            if u not in prev:
                continue
            path, x = [], u
            while x is not None:
                path.append(x)
                x = prev[x]
            cyc = [u] + path[::-1][:-1]  # u -> v -> ... (ends before u)
            r = cyc.index(min(cyc))
            cyc = tuple(cyc[r:] + cyc[:r])
            if cyc not in seen:
                seen.add(cyc)
                result.append(cyc)
    # keep the shortest cycles that together still cover every edge of the component
    covered, chosen = set(), []
    for cyc in sorted(result, key=lambda c: (len(c), c)):
        ring = list(cyc) + [cyc[0]]
        pairs = set(zip(ring, ring[1:]))
        if pairs - covered:
            chosen.append(cyc)
            covered |= pairs
    return chosen


# --------------------------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("--max-lines", type=int, default=700)
    ap.add_argument("--graph", action="store_true", help="print each file's dependency edges (for debugging)")
    args = ap.parse_args(argv)
    root = args.root
    if not os.path.isdir(root):
        print(f"error: {root} is not a directory", file=sys.stderr)
        return 2

    crate_dirs = []
    if os.path.isdir(os.path.join(root, "src")):
        crate_dirs.append(".")
    for d in sorted(os.listdir(root)):
        if d.startswith(".") or d == "target":
            continue
        if os.path.isdir(os.path.join(root, d, "src")):
            crate_dirs.append(d)

    problems, nfiles = 0, 0
    findings = []
    crates = []
    for cd in crate_dirs:
        src = os.path.normpath(os.path.join(cd, "src"))
        files = {}
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, src)):
            dirnames.sort()
            for fn in sorted(filenames):
                if fn.endswith(".rs"):
                    rel = os.path.relpath(os.path.join(dirpath, fn), root)
                    files[rel] = FileInfo(root, rel)
        nfiles += len(files)
        for rel in sorted(files):
            if files[rel].lines > args.max_lines:
                findings.append(f"{rel}: {files[rel].lines} lines (over {args.max_lines})")
                problems += 1
        crates.append(Crate(root, cd, files))

    for crate in crates:
        edges = crate.edges()
        adj = {s: set(d) for s, d in edges.items()}
        if args.graph:
            for s in sorted(edges):
                print(f"graph: {s}")
                for d in sorted(edges[s]):
                    line, text = edges[s][d]
                    print(f"    -> {d}    ({s}:{line}: {text})")
        for comp in tarjan(sorted(adj), adj):
            if len(comp) < 2:
                continue
            cycles = cycles_of(comp, adj)
            findings.append(f"strongly connected: {len(comp)} files, {len(cycles)} cycles: " + ", ".join(comp))
            if len(cycles) > 2:  # the edges most cycles go through: the first candidates to break
                count = {}
                for cyc in cycles:
                    ring = list(cyc) + [cyc[0]]
                    for pair in zip(ring, ring[1:]):
                        count[pair] = count.get(pair, 0) + 1
                top = sorted((c, p) for p, c in count.items() if c > 1)[::-1][:3]
                for c, (a, b) in sorted(top, key=lambda t: (-t[0], t[1])):
                    line, text = edges[a][b]
                    findings.append(f"  in {c} of {len(cycles)} cycles: {a} -> {b} ({a}:{line}: {text})")
            for cyc in cycles:
                ring = list(cyc) + [cyc[0]]
                findings.append("cycle: " + " -> ".join(ring))
                for a, b in zip(ring, ring[1:]):
                    line, text = edges[a][b]
                    findings.append(f"    {a}:{line}: {text}")
                problems += 1

    for f in findings:
        print(f)
    print(f"structure: {nfiles} files, {problems} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

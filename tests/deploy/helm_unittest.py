#!/usr/bin/env python3
"""Runs helm-unittest suites (tests/*_test.yaml) with the real helm binary, for a machine without the plugin.

  helm_unittest.py --helm HELM CHART_DIR [SUITE ...]     (default: CHART_DIR/tests/*_test.yaml)

Cozystack's CI runs these suites with the helm-unittest plugin (`helm unittest .`), which neither Debian nor npm
ships. This evaluator follows the plugin's source (helm-unittest/helm-unittest, pkg/unittest: test_job.go,
assertion.go, validators/, valueutils/) for what the suites here use, so that a suite the plugin would fail fails
here first:

- values: the suite's `values` files then the test's (paths relative to the suite file), then the suite's `set`,
  then the test's (`a.b[0].c` paths or nested maps); each later one wins key by key (Helm's MergeTables), and the
  result is handed to `helm template -f`, so the chart's defaults, null-deletes-key and the schema apply as in Helm.
- what is rendered: the suite's `templates` and every partial (`_*`), nothing else (CopyV3Chart), in a copy of the
  chart; `release` (suite, then test) gives the release name and namespace.
- documents: per template file, empty documents dropped. `helm template` sorts documents by kind; a template with
  documents of several kinds is accepted only when that order is the order of its `kind:` lines (else a
  documentIndex into it could differ from the plugin's file order, and the evaluator refuses to guess).
- selection: an assertion's `template`, else the test's `template`/`templates`, else the suite's; `documentIndex`
  (assertion, overridden by the test's) picks one document of each; `documentSelector` (assertion, else test's)
  keeps the documents whose `path` holds `value`, failing with "document not found" or "multiple indexes found"
  as the plugin does. An assertion holds when it holds for every selected template.
- kinds: equal/notEqual, contains/notContains (`content`, optional `count`), isKind, hasDocuments (all documents of
  the template, not the selected ones), matchRegex/notMatchRegex, exists/notExists, isSubset/isNotSubset,
  failedTemplate (`errorMessage` exact, `errorPattern` a regular expression searched for); `not: true` negates.
  Values compare as Go's reflect.DeepEqual does (an int never equals a float or a string), and an `equal` on a
  string first drops spaces before line ends and leading newlines, as the plugin's uniformContent does.
- render errors: a values file refused by the schema is the render error failedTemplate sees whole; a template's
  `fail` (or any execution error) is reduced to its message and belongs to the template that failed (to every
  selected template when it failed in a partial), as the plugin's parseRenderError does. Any other assertion on a
  test whose render failed fails.
Anything else a suite uses (another assertion kind, an unsupported path syntax) is an error, never a pass.
Exit 0 when every test passes; each failure is printed with its suite, test and assertion.
"""
import argparse
import copy
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml


# goyaml v3 (the plugin's) resolves only true/false as booleans; PyYAML's YAML 1.1 also takes yes/no/on/off.
class _Loader(yaml.SafeLoader):
    pass


_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))


def load(text):
    return yaml.load(text, Loader=_Loader)


def load_all(text):
    return list(yaml.load_all(text, Loader=_Loader))


class SuiteError(Exception):
    """The suite asks for something this evaluator does not do: reported as a failure."""


# ---- values -------------------------------------------------------------------------------------------------

def merge_tables(dst, src):
    """Helm's chartutil.MergeTables: keys of src missing in dst are copied; maps present in both are merged."""
    for k, v in src.items():
        if k not in dst:
            dst[k] = v
        elif isinstance(dst[k], dict) and isinstance(v, dict):
            merge_tables(dst[k], v)
    return dst


def set_path_tokens(path):
    """The plugin's --set path syntax: keys separated by '.', list indices in [N], [a.b] an escaped key."""
    tokens, i, key = [], 0, ""
    while i < len(path):
        c = path[i]
        if c == ".":
            if key:
                tokens.append(key)
            key = ""
        elif c == "[":
            end = path.index("]", i)
            inner = path[i + 1:end]
            if key:
                tokens.append(key)
                key = ""
                tokens.append(int(inner))
            else:
                tokens.append(inner)  # escaped map key
            i = end
        elif c in ",{}=":
            raise SuiteError(f"invalid token {c} in set path {path!r}")
        else:
            key += c
        i += 1
    if key:
        tokens.append(key)
    return tokens


def build_set(path, value):
    tokens = set_path_tokens(path)
    out = value
    for t in reversed(tokens):
        if isinstance(t, int):
            lst = [None] * (t + 1)
            lst[t] = out
            out = lst
        else:
            out = {t: out}
    return out


def user_values(suite, suite_file, test):
    base = {}
    here = os.path.dirname(suite_file)
    for f in list(suite.get("values") or []) + list(test.get("values") or []):
        path = f if os.path.isabs(f) else os.path.join(here, f)
        with open(path) as fh:
            merge_tables_into = load(fh.read()) or {}
        base = merge_tables(copy.deepcopy(merge_tables_into), base)
    for sets in (suite.get("set") or {}, test.get("set") or {}):
        for path, value in sets.items():
            base = merge_tables(build_set(path, copy.deepcopy(value)), base)
    return base


# ---- paths (yaml-jsonpath, as the plugin's GetValueOfSetPath uses it) --------------------------------------------

_PATH_TOKEN = re.compile(r"""\.?([A-Za-z0-9_\-/$]+)|\[(\d+)\]|\["([^"]*)"\]|\['([^']*)'\]|\[\*\]|\.\*""")


def path_tokens(path):
    tokens, pos = [], 0
    while pos < len(path):
        m = _PATH_TOKEN.match(path, pos)
        if not m or m.end() == pos:
            raise SuiteError(f"path syntax this evaluator does not do: {path!r} at {path[pos:]!r}")
        if m.group(1) is not None:
            tokens.append(("key", m.group(1)))
        elif m.group(2) is not None:
            tokens.append(("index", int(m.group(2))))
        elif m.group(3) is not None:
            tokens.append(("key", m.group(3)))
        elif m.group(4) is not None:
            tokens.append(("key", m.group(4)))
        else:
            tokens.append(("all", None))
        pos = m.end()
    return tokens


def get_values(doc, path):
    if path == "":
        return [doc]
    nodes = [doc]
    for kind, arg in path_tokens(path):
        nxt = []
        for n in nodes:
            if kind == "key" and isinstance(n, dict) and arg in n:
                nxt.append(n[arg])
            elif kind == "index" and isinstance(n, list) and arg < len(n):
                nxt.append(n[arg])
            elif kind == "all":
                nxt.extend(n.values() if isinstance(n, dict) else n if isinstance(n, list) else [])
        nodes = nxt
    return nodes


def deep_equal(a, b):
    """reflect.DeepEqual over decoded YAML: types must match (bool is not int, int is not float)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(deep_equal(x, y) for x, y in zip(a, b))
    return a == b


def uniform(s):
    return re.sub(r"(?m)[ ]+\r?\n", "\n", s).lstrip("\n")


# ---- rendering -------------------------------------------------------------------------------------------------

def template_name(t):
    return t if t.startswith("templates/") else "templates/" + t


# test_job.go's regexPattern, "(?msU)^(?:.+: |.+ \()(?:(.+):\d+:\d+).+(?:.+>)*: (.+)$", with Go's U (ungreedy)
# written as lazy quantifiers.
_RENDER_ERROR = re.compile(r"^(?:.+?: |.+? \()(?:(.+?):\d+:\d+).+?(?:.+?>)*?: (.+?)$", re.M | re.S)


def parse_render_error(message):
    m = _RENDER_ERROR.search(message)
    if not m:
        return "", ""
    lines = message.split("\n", 1)
    return m.group(1), (lines[1] if len(lines) > 1 else m.group(2))


class Rendered:
    def __init__(self):
        self.ok = True
        self.docs = {}           # template name -> [manifest]
        self.render_error = None  # error before templates ran (schema): failedTemplate sees it whole


def render(helm, chart, chart_name, templates, release, values):
    work = tempfile.mkdtemp(prefix="helm-unittest-")
    try:
        copy_dir = os.path.join(work, os.path.basename(chart.rstrip("/")))
        shutil.copytree(chart, copy_dir, ignore=shutil.ignore_patterns("tests"))
        keep = {template_name(t) for t in templates} if templates else None
        for path in glob.glob(os.path.join(copy_dir, "templates", "**", "*"), recursive=True):
            rel = os.path.relpath(path, copy_dir)
            if os.path.isfile(path) and not os.path.basename(path).startswith("_") and keep is not None \
                    and rel not in keep:
                os.remove(path)
        values_file = os.path.join(work, "values.yaml")
        with open(values_file, "w") as fh:
            yaml.safe_dump(values, fh)
        name = release.get("name")
        if not name:
            raise SuiteError("no release.name: the plugin's default RELEASE-NAME is not a name helm template takes")
        cmd = [helm, "template", name, copy_dir, "-f", values_file]
        if release.get("namespace"):
            cmd += ["--namespace", release["namespace"]]
        if release.get("upgrade"):
            cmd += ["--is-upgrade"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        out = Rendered()
        if proc.returncode != 0:
            out.ok = False
            message = proc.stderr.strip()
            message = message[len("Error: "):] if message.startswith("Error: ") else message
            # helm template's own hint after a failed render; the plugin gets the engine's error without it.
            message = re.sub(r"\s*Use --debug flag to render out invalid YAML$", "", message)
            file_path, raw = parse_render_error(message)
            if not file_path and not raw:
                out.render_error = message
                return out
            rel = file_path.split("/", 1)[1] if "/" in file_path else file_path
            if os.path.basename(rel).startswith("_"):
                for t in templates:
                    out.docs[template_name(t)] = [{"raw": raw}]
            else:
                out.docs[rel] = [{"raw": raw}]
            return out
        current = None
        for chunk in re.split(r"^---\s*$", proc.stdout, flags=re.M):
            m = re.search(r"^# Source: ([^\n]+)$", chunk, re.M)
            if m:
                current = m.group(1).split("/", 1)[1]
            elif current is None:
                continue
            # else: a template whose output holds its own `---` (e.g. Files.Get of a file starting with one):
            # helm prints the Source line once, and the documents after it are still that template's.
            doc = load(chunk)
            if doc:
                out.docs.setdefault(current, []).append(doc)
        for t, docs in out.docs.items():
            kinds = [d.get("kind") for d in docs]
            if len(set(kinds)) > 1:
                with open(os.path.join(copy_dir, t)) as fh:
                    source_kinds = re.findall(r"^kind: *(\S+)", fh.read(), re.M)
                if kinds != [k for k in source_kinds if k in kinds][:len(kinds)]:
                    raise SuiteError(f"{t}: helm template ordered its kinds {kinds}, the file lists {source_kinds}: "
                                     "the plugin's document order is not known here")
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---- assertions ------------------------------------------------------------------------------------------------

KINDS = {"equal": False, "notEqual": True, "contains": False, "notContains": True, "isKind": False,
         "hasDocuments": False, "matchRegex": False, "notMatchRegex": True, "exists": False, "notExists": True,
         "isSubset": False, "isNotSubset": True, "failedTemplate": False}


def select(docs_by_template, index, selector):
    """assertion.go selectDocumentsForAssertion + DocumentSelector.SelectDocuments: (selected, error)."""
    if selector and selector.get("path"):
        match_many = bool(selector.get("matchMany"))
        skip_empty = bool(selector.get("skipEmptyTemplates"))
        out, count = {}, 0
        for t, docs in docs_by_template.items():
            chosen = []
            for d in docs:
                if any(not ("value" in selector) or deep_equal(selector["value"], v)
                       for v in get_values(d, selector["path"])):
                    if not match_many and chosen:
                        return {}, "multiple indexes found"
                    chosen.append(d)
            if not chosen and not skip_empty:
                return {}, "document not found"
            count += len(chosen)
            if not match_many and count > 1:
                return {}, "multiple indexes found"
            if chosen or not skip_empty:
                out[t] = chosen
        return out, None
    if index != -1:
        out = {}
        for t, docs in docs_by_template.items():
            if index >= len(docs):
                return {}, f"document index {index} is out of range"
            out[t] = [docs[index]]
        return out, None
    return docs_by_template, None


def per_manifest(manifests, negative, check):
    """The validators' loop: every manifest must pass; no manifest passes only when negated."""
    if not manifests:
        return negative, ["no manifest found"]
    errors, ok = [], True
    for i, m in enumerate(manifests):
        passed, why = check(m)
        if not passed:
            ok = False
            errors.append(f"document {i}: {why}")
    return ok, errors


def values_check(path, negative, single):
    """equal/matchRegex/contains/isSubset over a path: unknown path fails unless negated."""
    def check(manifest):
        actuals = get_values(manifest, path)
        if not actuals:
            return negative, f"unknown path {path}"
        for a in actuals:
            passed, why = single(a)
            if not passed:
                return False, why
        return True, ""
    return check


def run_assert(kind, params, negative, rendered, selected, all_docs):
    if kind == "failedTemplate":
        message, pattern = params.get("errorMessage", ""), params.get("errorPattern", "")
        if message and pattern:
            return False, ["single attribute 'errorMessage' or 'errorPattern' supported at the same time"]

        def matches(actual):
            if pattern:
                try:
                    return re.search(pattern, actual) is not None
                except re.error:
                    return re.search(re.escape(pattern), actual) is not None
            return actual == message
        if rendered.render_error is not None:
            if not message and not pattern:
                return True, []
            ok = matches(rendered.render_error) != negative
            return ok, [] if ok else [f"error {rendered.render_error!r} does not match {message or pattern!r}"]
        if not selected:
            return negative, ["No failed document"]
        for m in selected:
            actual = m.get("raw") if isinstance(m, dict) else None
            if not message and not pattern:
                continue
            if actual is None or matches(actual) == negative:
                return False, [f"error {actual!r} does not match {message or pattern!r}"]
        return True, []
    if kind == "hasDocuments":
        count = len(all_docs)
        ok = (count == params["count"]) != negative
        return ok, [] if ok else [f"{count} documents, expected {'not ' if negative else ''}{params['count']}"]
    if kind == "isKind":
        return per_manifest(selected, negative,
                            lambda m: ((m.get("kind") == params["of"]) != negative, f"kind {m.get('kind')}"))
    path = params.get("path", "")
    if kind in ("equal", "notEqual"):
        def single(a):
            actual = uniform(a) if isinstance(a, str) else a
            return deep_equal(params.get("value"), actual) != negative, f"{path} is {a!r}"
    elif kind in ("matchRegex", "notMatchRegex"):
        rx = re.compile(params["pattern"])

        def single(a):
            if not isinstance(a, str):
                return False, f"expect '{path}' to be a string, got {a!r}"
            return (rx.search(a) is not None) != negative, f"{path} is {a!r}"
    elif kind in ("contains", "notContains"):
        def single(a):
            if not isinstance(a, list):
                return False, f"expect '{path}' to be an array, got {a!r}"
            found = sum(1 for e in a if deep_equal(e, params.get("content")))
            if "count" in params:
                return (found > 0 and found == params["count"]) != negative, f"{found} in {path}"
            return (found > 0) != negative, f"{path}: {a!r}"
    elif kind in ("isSubset", "isNotSubset"):
        def single(a):
            if not isinstance(a, dict) or not isinstance(params.get("content"), dict):
                return False, f"expect '{path}' to be an object, got {a!r}"
            found = all(deep_equal(a.get(k), v) for k, v in params["content"].items())
            return found != negative, f"{path}: {a!r}"
    elif kind in ("exists", "notExists"):
        def check(m):
            return (len(get_values(m, path)) > 0) != negative, f"{path} {'exists' if negative else 'missing'}"
        return per_manifest(selected, negative, check)
    else:
        raise SuiteError(f"assertion kind {kind} is not one this evaluator does")
    return per_manifest(selected, negative, values_check(path, negative, single))


def run_test(helm, chart, suite, suite_file, test):
    templates = [template_name(t) for t in (suite.get("templates") or [])]
    release = dict(suite.get("release") or {})
    release.update(test.get("release") or {})
    rendered = render(helm, chart, None, templates, release, user_values(suite, suite_file, test))
    failures = []
    asserts = test.get("asserts") or []
    if not asserts:
        raise SuiteError("a test without asserts")
    require_success = any(next(iter(k for k in a if k in KINDS), None) != "failedTemplate" for a in asserts)
    if not rendered.ok and require_success:
        return [f"render failed: {rendered.render_error or rendered.docs}"]
    for n, a in enumerate(asserts):
        kinds = [k for k in a if k in KINDS]
        unknown = [k for k in a if k not in KINDS and k not in ("not", "documentIndex", "template", "documentSelector")]
        if unknown or len(kinds) != 1:
            raise SuiteError(f"assertion {n}: kinds {unknown or kinds} (one of {sorted(KINDS)} expected)")
        kind = kinds[0]
        negative = bool(a.get("not")) != KINDS[kind]
        if a.get("template"):
            targets = [template_name(a["template"])]
        elif test.get("templates"):
            targets = [template_name(t) for t in test["templates"]]
        elif test.get("template"):
            targets = [template_name(test["template"])]
        else:
            targets = templates or sorted(rendered.docs)
        index = test["documentIndex"] if "documentIndex" in test else a.get("documentIndex", -1)
        selector = a.get("documentSelector") or test.get("documentSelector")
        docs_by_template = {t: rendered.docs.get(t, []) for t in targets}
        selected, error = select(docs_by_template, index, selector)
        if error:
            failures.append(f"assert {n} {kind}: {error}")
            continue
        if not selected:
            ok, why = run_assert(kind, a[kind] or {}, negative, rendered, [], [])
            if not ok:
                failures.append(f"assert {n} {kind}: {'; '.join(why)}")
            continue
        for t in sorted(selected):
            ok, why = run_assert(kind, a[kind] or {}, negative, rendered, selected[t], rendered.docs.get(t, []))
            if not ok:
                failures.append(f"assert {n} {kind} ({t}): {'; '.join(why)[:600]}")
    return failures


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--helm", required=True)
    p.add_argument("chart")
    p.add_argument("suites", nargs="*")
    args = p.parse_args()
    suites = args.suites or sorted(glob.glob(os.path.join(args.chart, "tests", "*_test.yaml")))
    if not suites:
        # hack/helm-unit-tests.sh fails a package whose run finds no suite; so does this.
        print(f"FAIL {args.chart}: no suite (tests/*_test.yaml)")
        return 1
    passed = failed = 0
    for suite_file in suites:
        with open(suite_file) as fh:
            suite = load(fh.read())
        tests = suite.get("tests") or []
        if not tests:
            print(f"FAIL {suite_file}: no tests")
            failed += 1
            continue
        for test in tests:
            try:
                failures = run_test(args.helm, args.chart, suite, suite_file, test)
            except SuiteError as e:
                failures = [f"suite error: {e}"]
            name = f"{os.path.basename(suite_file)}: {test.get('it')}"
            if failures:
                failed += 1
                print(f"FAIL {name}")
                for f in failures:
                    print(f"    {f}")
            else:
                passed += 1
                print(f"PASS {name}")
    print(f"Suites: {len(suites)}, tests: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

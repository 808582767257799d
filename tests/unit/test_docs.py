"""The repository explains itself: ``docs/`` agrees with the code, and nothing points outside the repository.

- the generated pages (``docs/openapi.json``, ``docs/configuration.md``) equal what ``scripts/gen_docs.py``
  makes from the code now, and every setting has a meaning;
- the hand-written pages name every key, script, route and guarantee the code has;
- no Markdown link, and no citation in code or configuration, leaves the repository, and every relative link
  (with its ``#anchor``) and every repository path a page quotes exists.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferq.config.settings import Settings
from inferq.queue.keys import Keys
from scripts import gen_docs

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REGENERATE = f"run `{gen_docs.COMMAND}` and commit the result"

# ------------------------------------------------------------------ scanning the repository

SKIP_DIRS = {".git", ".venv", ".tools", ".aws-sam", ".inferq", ".mypy_cache", ".pytest_cache", ".ruff_cache",
             ".hypothesis", "__pycache__", "node_modules", "build", "dist"}
SKIP_PATHS = {"bench/out"}
VISITED_HIDDEN_DIRS = {".github", ".ci"}
"""Hidden folders are tools' caches and environments, except these, which hold the project's own files."""
SCANNED_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".toml", ".lua", ".mk"}
SCANNED_NAMES = {"Makefile", "Dockerfile"}

# Built from parts so that this file does not match its own patterns.
_OWNER_FILES = ("DESIGN", "STYLE")
CITATION = re.compile(r"\b(?:" + "|".join(_OWNER_FILES) + r")\.md\b|(?<![\w.-])" + "shared" + r"/")
PARENT_PATH = re.compile(r"(?:\.\./)+[^\s)\]'\"`>,;]*")
URL = re.compile(r"\bhttps?://[^\s)>\]`'\"]+", re.IGNORECASE)
LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "[::1]")

FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})[^\n]*\n.*?^\1\2[^\S\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.DOTALL)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
AUTOLINK = re.compile(r"<([a-z][a-z0-9+.-]*:[^\s>]+)>", re.IGNORECASE)
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)


def scanned_files(root: Path = ROOT) -> Iterator[Path]:
    """The repository's own text files of the kinds that can cite something (no virtual environments, caches
    or build outputs)."""
    for directory, subdirs, files in os.walk(root):
        rel = Path(directory).relative_to(root)
        subdirs[:] = sorted(
            d for d in subdirs
            if d not in SKIP_DIRS and not d.endswith(".egg-info")
            and (not d.startswith(".") or d in VISITED_HIDDEN_DIRS)
            and (rel / d).as_posix() not in SKIP_PATHS
        )
        for name in sorted(files):
            if Path(name).suffix in SCANNED_SUFFIXES or name in SCANNED_NAMES:
                yield Path(directory) / name


def _line(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _blank(match: re.Match[str]) -> str:
    """Code replaced by spaces of the same shape, so positions (line numbers) stay true."""
    return re.sub(r"[^\n]", " ", match.group(0))


def markdown_prose(text: str) -> str:
    """The Markdown without fenced blocks and inline code: what renders as text and links."""
    return INLINE_CODE.sub(_blank, FENCE.sub(_blank, text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for match in HEADING.finditer(FENCE.sub(_blank, path.read_text())):
        base = slug(match.group(1))
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def escapes(path: Path, root: Path = ROOT) -> list[str]:
    """Every citation in ``path`` of something a clone does not contain: the owner's design files, a shared
    folder beside the repository, a parent-folder path that climbs out of the repository (in code blocks too),
    and in Markdown's prose any link or address of another site."""
    text = path.read_text(errors="replace")
    where = path.relative_to(root).as_posix()
    found = [f"{where}:{_line(text, m.start())}: cites {m.group(0)!r}" for m in CITATION.finditer(text)]
    for m in PARENT_PATH.finditer(text):
        if not _inside(path.parent / m.group(0), root):
            found.append(f"{where}:{_line(text, m.start())}: {m.group(0)!r} leaves the repository")
    if path.suffix == ".md":
        prose = markdown_prose(text)
        targets = [m for p in (INLINE_LINK, REFERENCE_LINK, AUTOLINK) for m in p.finditer(prose)]
        for m in targets:
            if re.match(r"[a-z][a-z0-9+.-]*:|//", m.group(1), re.IGNORECASE):
                found.append(f"{where}:{_line(text, m.start())}: link to {m.group(1)!r} leaves the repository")
        linked = {m.start(1) for m in targets}
        for m in URL.finditer(prose):
            host = m.group(0).split("://", 1)[1]
            if m.start() not in linked and not host.startswith(LOCAL_HOSTS):
                found.append(f"{where}:{_line(text, m.start())}: address {m.group(0)!r} leaves the repository")
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Relative Markdown links of ``path`` whose file or ``#anchor`` does not exist."""
    text = path.read_text()
    prose = markdown_prose(text)
    where = path.relative_to(root).as_posix()
    found = []
    for m in [*INLINE_LINK.finditer(prose), *REFERENCE_LINK.finditer(prose)]:
        target = m.group(1)
        if not target or re.match(r"[a-z][a-z0-9+.-]*:|//", target, re.IGNORECASE):
            continue  # empty, or another site: escapes() reports those
        file_part, _, anchor = target.partition("#")
        linked = path if not file_part else (root / file_part.lstrip("/") if file_part.startswith("/")
                                             else path.parent / file_part)
        if not linked.exists():
            found.append(f"{where}:{_line(text, m.start())}: {target!r}: no such file")
        elif not _inside(linked, root):
            continue  # escapes() reports it
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            found.append(f"{where}:{_line(text, m.start())}: {target!r}: no heading with that anchor")
    return found


# ------------------------------------------------------------------ generated pages


@pytest.mark.parametrize("path", list(gen_docs.GENERATED), ids=lambda p: p.name)
def test_the_generated_page_is_what_the_code_generates_now(path: Path) -> None:
    expected = gen_docs.GENERATED[path]()
    assert path.exists(), f"{path.relative_to(ROOT)} is missing: {REGENERATE}"
    assert path.read_text() == expected, f"{path.relative_to(ROOT)} is stale: {REGENERATE}"


def test_every_setting_has_a_meaning() -> None:
    missing = [Settings.variable(name) for name in gen_docs.missing_docs()]
    assert not missing, (
        f"no meaning for {', '.join(missing)}: add one line per variable to SETTING_DOCS in scripts/gen_docs.py "
        f"(or doc= metadata on the field in inferq/config/settings.py), then {REGENERATE}"
    )


def test_no_meaning_is_kept_for_a_setting_that_does_not_exist() -> None:
    unknown = gen_docs.unknown_docs()
    assert not unknown, f"SETTING_DOCS in scripts/gen_docs.py describes {unknown}, which Settings does not have"


def test_the_configuration_page_lists_every_variable_with_its_default() -> None:
    page = gen_docs.configuration_md()
    for f in dataclasses.fields(Settings):
        row = next((line for line in page.splitlines() if line.startswith(f"| `{Settings.variable(f.name)}` |")), None)
        assert row is not None, f"{Settings.variable(f.name)} has no row"
        default = "unset" if f.default is None else str(f.default).lower() if isinstance(f.default, bool) else None
        if default is not None:
            assert default in row
        elif not isinstance(f.default, float):
            assert f"`{f.default}`" in row


def test_the_accepted_values_come_from_the_parsers_bounds() -> None:
    page = gen_docs.configuration_md()
    assert "| `INFERQ_MAX_ATTEMPTS` | `3` | integer 1 to 100 |" in page
    assert "| `INFERQ_REDIS_TIMEOUT_S` | `2` | number ≥ 0.05 |" in page


def test_every_inferq_variable_the_code_reads_is_documented() -> None:
    documented = {Settings.variable(f.name) for f in dataclasses.fields(Settings)}
    documented |= {Settings.variable(name) for name in gen_docs.PLANNED} | set(gen_docs.OTHER_VARIABLES)
    placeholders = {"INFERQ_X", "INFERQ_NAME"}  # how docstrings and help texts say "any variable"
    seen: dict[str, str] = {}
    for path in scanned_files():
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("tests", "docs") or path.suffix == ".md":
            continue
        for name in re.findall(r"\bINFERQ_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()):
            seen.setdefault(name, rel.as_posix())
    undocumented = {name: where for name, where in seen.items() if name not in documented | placeholders}
    assert not undocumented, (
        f"variables read outside Settings and not documented: {undocumented}; add them to OTHER_VARIABLES in "
        f"scripts/gen_docs.py, then {REGENERATE}"
    )


# ------------------------------------------------------------------ settings: docs/configuration.md is the one source

VARIABLE = re.compile(r"\bINFERQ_[A-Z0-9_]*[A-Z0-9]\b")
QUOTED_DEFAULT = re.compile(
    r"`?(INFERQ_[A-Z0-9_]*[A-Z0-9])`? \((?:default )?`?(\d[\d,]*(?:\.\d+)?)`?(?: ?(?:s|ms|seconds))?\)")
"""A default given in prose beside its variable: "`INFERQ_API_KEYS_CACHE_S` (300 s)", "INFERQ_WINDOW_MAX (64)"."""


def hand_written_pages() -> list[Path]:
    """The pages a person writes (:data:`HAND_WRITTEN`): they may name a setting, but its meaning and default live
    in docs/configuration.md."""
    return sorted(set(HAND_WRITTEN) - {gen_docs.CONFIGURATION_PATH})


def documented_variables() -> set[str]:
    documented = {Settings.variable(f.name) for f in dataclasses.fields(Settings)}
    return documented | {Settings.variable(name) for name in gen_docs.PLANNED} | set(gen_docs.OTHER_VARIABLES)


def test_every_variable_a_page_or_the_template_names_is_on_the_configuration_page() -> None:
    placeholders = {"INFERQ_X", "INFERQ_NAME"}
    unknown = {}
    for path in [*hand_written_pages(), ROOT / "template.yaml", *sorted((ROOT / "infra").glob("*.yaml"))]:
        for name in set(VARIABLE.findall(path.read_text())) - documented_variables() - placeholders:
            unknown[name] = path.relative_to(ROOT).as_posix()
    assert not unknown, f"named but not in docs/configuration.md (no such setting?): {unknown}"


def test_every_page_that_names_a_setting_links_to_the_configuration_page() -> None:
    unlinked = []
    for path in hand_written_pages():
        text = path.read_text()
        if not VARIABLE.search(text):
            continue
        target = os.path.relpath(gen_docs.CONFIGURATION_PATH, path.parent)
        if f"]({target}" not in text and f"]({target.removeprefix('./')}" not in text:
            unlinked.append(path.relative_to(ROOT).as_posix())
    assert not unlinked, f"these pages name settings but do not link to docs/configuration.md: {unlinked}"


def test_a_default_quoted_beside_its_variable_is_the_code_default() -> None:
    """A page that says "`INFERQ_X` (300 s)" says what the code does: the generated table is the source."""
    defaults = {Settings.variable(f.name): f.default for f in dataclasses.fields(Settings)}
    wrong, checked = [], 0
    sources = [*hand_written_pages(), ROOT / "template.yaml", *sorted((ROOT / "infra").glob("*.yaml"))]
    for path in sources:
        text = path.read_text()
        for m in QUOTED_DEFAULT.finditer(text):
            name, quoted = m.group(1), float(m.group(2).replace(",", ""))
            default = defaults.get(name)
            if not isinstance(default, int | float) or isinstance(default, bool):
                continue
            checked += 1
            if quoted != default:
                wrong.append(f"{path.relative_to(ROOT)}:{_line(text, m.start())}: {m.group(0)!r}, the default "
                             f"is {default}")
    assert checked >= 5  # the check sees the pages' defaults
    assert not wrong, "defaults quoted in the docs that are not the code's (docs/configuration.md): " + "; ".join(
        wrong)


def test_a_template_parameter_described_as_a_setting_sets_that_setting() -> None:
    """A parameter whose description begins with a variable ("INFERQ_WINDOW, the jobs one worker runs ...") is the
    one that variable is set from: directly, or through the nested stack it is passed to."""
    from tests.infra.cfn import load

    template = ROOT / "template.yaml"
    texts = [template.read_text(), *(p.read_text() for p in sorted((ROOT / "infra").glob("*.yaml")))]
    described = {}
    for name, parameter in load(template)["Parameters"].items():
        found = re.match(r"\s*(INFERQ_[A-Z0-9_]*[A-Z0-9])\b", str(parameter.get("Description", "")))
        if found:
            described[name] = found.group(1)
    assert len(described) >= 10  # the check sees the template's parameters

    def set_from(variable: str) -> list[str]:  # a function's Variables, or a task definition's Environment
        shapes = (rf"^\s*{variable}: (.+)$", rf"^\s*- Name: {variable}\n\s*Value: (.+)$")
        return [m.group(1) for text in texts for shape in shapes for m in re.finditer(shape, text, re.MULTILINE)]

    wrong = []
    for parameter, variable in described.items():
        passed_as = {m.group(1) for m in re.finditer(rf"^\s*(\w+): !Ref {parameter}\s*$", texts[0], re.MULTILINE)}
        names = {parameter} | passed_as
        if not any(re.search(rf"\b{n}\b", line) for n in names for line in set_from(variable)):
            wrong.append(f"{parameter} (described as {variable}, which is set from {set_from(variable) or 'nothing'})")
    assert not wrong, f"template parameters described as a setting they do not set: {wrong}"

    # and a parameter's range is one the setting's parser accepts: no stack deploys a value its processes refuse
    fields = {Settings.variable(f.name): f for f in dataclasses.fields(Settings)}
    outside = []
    for parameter, variable in described.items():
        spec, field = load(template)["Parameters"][parameter], fields.get(variable)
        parse = field.metadata.get("parse") if field else None
        code, cells = getattr(parse, "__code__", None), getattr(parse, "__closure__", None) or ()
        bounds = dict(zip(code.co_freevars, [c.cell_contents for c in cells], strict=True)) if code else {}
        lo, hi = bounds.get("lo"), bounds.get("hi")
        unset_below = any("AWS::NoValue" in line for line in set_from(variable))  # e.g. 0: the variable is not set
        if "MinValue" in spec and lo is not None and float(spec["MinValue"]) < lo and not unset_below:
            outside.append(f"{parameter}: MinValue {spec['MinValue']} < {variable}'s {lo}")
        if "MaxValue" in spec and hi is not None and float(spec["MaxValue"]) > hi:
            outside.append(f"{parameter}: MaxValue {spec['MaxValue']} > {variable}'s {hi}")
    assert not outside, f"template parameters that allow values the setting refuses: {outside}"


def _names_in(node: object) -> set[str]:
    """Every variable a piece of template sets: keys of ``Variables``, ``Name`` of an ECS environment or secret
    entry (inside ``Fn::If`` too)."""
    found: set[str] = set()
    if isinstance(node, dict):
        if isinstance(node.get("Name"), str):
            found.add(node["Name"])
        if isinstance(node.get("Variables"), dict):
            found |= set(node["Variables"])
        for value in node.values():
            found |= _names_in(value)
    elif isinstance(node, list):
        for value in node:
            found |= _names_in(value)
    return found


def test_deploy_md_says_which_process_gets_which_variable_as_the_templates_do() -> None:
    """DEPLOY.md's table (variable | gateway | scaler | worker | from) against template.yaml (the functions, with
    Globals) and infra/gpu.yaml (the worker container): each variable a process gets is in a row with that
    process's cell filled, and a filled cell is a variable the process does get."""
    from tests.infra.cfn import load

    template, gpu = load(ROOT / "template.yaml"), load(ROOT / "infra" / "gpu.yaml")
    shared = _names_in(template["Globals"]["Function"].get("Environment", {}))
    containers = gpu["Resources"]["TaskDefinition"]["Properties"]["ContainerDefinitions"]
    worker = next(c for c in containers if c.get("Name") == "worker")
    gets = {
        "gateway": shared | _names_in(template["Resources"]["GatewayFunction"]["Properties"].get("Environment")),
        "scaler": shared | _names_in(template["Resources"]["ScalerFunction"]["Properties"].get("Environment")),
        "worker": _names_in(worker.get("Environment")) | _names_in(worker.get("Secrets")),
    }
    prefixes = ("INFERQ_", "POWERTOOLS_")
    gets = {role: {n for n in names if n.startswith(prefixes)} for role, names in gets.items()}
    text = (ROOT / "DEPLOY.md").read_text()
    table = re.search(r"^\| variable \| gateway \| scaler \| worker \| from \|\n\|[-|]+\|\n((?:\|.*\|\n)+)", text,
                      re.MULTILINE)
    assert table, "DEPLOY.md has no table | variable | gateway | scaler | worker | from |"
    listed: set[str] = set()
    wrong = []
    for row in table.group(1).splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        names = set(re.findall(r"`((?:INFERQ|POWERTOOLS)_[A-Z0-9_]*[A-Z0-9])", cells[0]))
        names |= {re.sub(r"_[A-Z0-9]+$", m.group(2), m.group(1))
                  for m in re.finditer(r"`(INFERQ_[A-Z0-9_]+)/(_[A-Z0-9]+)`", cells[0])}  # `INFERQ_SCALE_MIN/_MAX`
        listed |= names
        for role, cell in zip(("gateway", "scaler", "worker"), cells[1:4], strict=True):
            given = names & gets[role]
            if cell and not given:
                wrong.append(f"{sorted(names)}: DEPLOY.md says the {role} gets it, the template gives it none")
            if not cell and given:
                wrong.append(f"{sorted(given)}: the template gives it to the {role}, DEPLOY.md's cell is empty")
    missing = sorted(set().union(*gets.values()) - listed)
    assert not missing, f"variables the templates set that DEPLOY.md's table does not list: {missing}"
    assert not wrong, "; ".join(wrong)


def test_the_openapi_document_has_every_route_of_the_app() -> None:
    import json

    document = json.loads((DOCS / "openapi.json").read_text())
    from functions.gateway.api import create_app
    from functions.gateway.hotpath import api_routes

    app = create_app(Settings(), keys={"k": "t"})
    routes = list(api_routes(app.routes))
    assert len(routes) > 20  # the included routers' routes, each
    for route in routes:
        if route.include_in_schema:  # the console's page and assets are not API
            for method in route.methods:
                assert method.lower() in document["paths"][route.path], f"{method} {route.path}"


# ------------------------------------------------------------------ hand-written pages agree with the code


def _page(name: str) -> str:
    return (DOCS / name).read_text()


def test_the_api_page_describes_every_route() -> None:
    from functions.gateway.api import create_app
    from functions.gateway.hotpath import api_routes

    page = _page("api.md")
    app = create_app(Settings(), keys={"k": "t"})
    routes = [(m, r.path) for r in api_routes(app.routes) for m in r.methods]
    assert routes
    for method, path in routes:
        plain = re.sub(r"\{job_id\}", "{id}", path)
        plain = re.sub(r"^/console/.*", "/console", plain)  # the console's assets are described with its page
        assert f"{method} {plain}" in page, f"docs/api.md does not describe {method} {plain}"


def test_the_api_page_names_every_error_type_the_gateway_answers() -> None:
    source = (ROOT / "functions" / "gateway" / "errors.py").read_text()
    page = _page("api.md")
    # the status -> type table ({404: "not_found", ...}) and the types given by name (type_="idempotency_conflict")
    types = set(re.findall(r'\b[1-5]\d\d:\s*"([a-z_]+)"', source)) | set(re.findall(r'type_="([a-z_]+)"', source))
    assert {"not_found", "unavailable", "idempotency_conflict"} <= types
    missing = sorted(t for t in types if f"`{t}`" not in page)
    assert not missing, f"docs/api.md does not name the error types {missing}"


def _key_suffixes() -> set[str]:
    keys = Keys("Q")
    suffixes = set()
    for name in list(vars(Keys)):
        if name.startswith("_") or name in ("prefix", "queue"):
            continue
        value = getattr(keys, name)
        if callable(value):
            arity = value.__code__.co_argcount - 1
            value = value(*(f"<{n}>" for n in value.__code__.co_varnames[1:1 + arity]))
        if isinstance(value, str):
            suffixes.add(value.removeprefix(keys.prefix))
    return suffixes


def test_the_data_model_page_names_every_key() -> None:
    page = _page("data-model.md")
    suffixes = _key_suffixes()
    assert {"stream", "done:<job_id>", "wake", "expiry"} <= suffixes
    for suffix in suffixes:
        shown = suffix.replace("<job_id>", "<id>")
        assert f"inferq:{{Q}}:{shown}" in page, f"docs/data-model.md does not name the key inferq:{{Q}}:{shown}"


def test_the_data_model_page_describes_every_script() -> None:
    page = _page("data-model.md")
    scripts = sorted(p.name for p in (ROOT / "inferq" / "queue" / "scripts").glob("*.lua"))
    includes = sorted(p.name for p in (ROOT / "inferq" / "queue" / "scripts" / "includes").glob("*.lua"))
    assert scripts
    for name in scripts + includes:
        assert f"`{name}`" in page, f"docs/data-model.md does not describe inferq/queue/scripts/{name}"


def test_the_guarantees_page_states_each_guarantee_and_each_fault() -> None:
    page = _page("guarantees.md")
    for n in range(1, 10):
        assert re.search(rf"^#+ .*\bG{n}\b", page, re.MULTILINE), f"docs/guarantees.md has no section for G{n}"
    for fault in ("failover", "freeze", "OOM"):
        assert re.search(rf"^#+ .*{fault}", page, re.MULTILINE | re.IGNORECASE), f"no section on {fault}"


def test_the_index_links_every_page() -> None:
    index = _page("README.md")
    for path in sorted(DOCS.iterdir()):
        if path.name != "README.md" and path.suffix in (".md", ".json"):
            assert f"]({path.name})" in index, f"docs/README.md does not link {path.name}"


def test_the_readme_opens_with_what_inferq_is_and_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = FENCE.search(text)
    assert first_block is not None
    title, _, opening = text[: first_block.start()].strip().partition("\n")
    assert title == "# inferq"
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", " ".join(opening.split())) if s]
    assert 2 <= len(sentences) <= 3 and "#" not in opening, f"open with two or three sentences: {sentences}"
    lines = [line.split("#")[0].strip() for line in first_block.group(0).splitlines()[1:-1]]
    assert lines == ["make up", "make test"]


def test_the_readme_keeps_a_summary_of_the_benchmarks_and_docs_keep_the_table() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "](docs/benchmarks.md#the-latest-full-run)" in readme
    assert "| scenario | result | target |" not in readme, "the full table belongs in docs/benchmarks.md"
    assert "| scenario | result | target |" in _page("benchmarks.md")


def test_the_readme_points_at_the_docs() -> None:
    text = (ROOT / "README.md").read_text()
    for page in ("docs/README.md", "docs/architecture.md", "docs/guarantees.md", "docs/api.md"):
        assert f"]({page}" in text, f"README.md does not link {page}"


# ------------------------------------------------------------------ nothing leaves the repository


def test_no_link_or_citation_leaves_the_repository() -> None:
    found = [problem for path in scanned_files() for problem in escapes(path)]
    assert not found, "cite docs/ instead of what a clone does not contain:\n" + "\n".join(found)


def test_every_relative_markdown_link_resolves() -> None:
    found = [problem for path in scanned_files() if path.suffix == ".md" for problem in broken_links(path)]
    assert not found, "\n".join(found)


QUOTED_PATH = re.compile(r"`((?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_.*-]*)(?:::(\w+))?`")
FILE_LIKE = re.compile(r"(?:\.(?:py|md|lua|yaml|yml|toml|json|txt|mk)|/Dockerfile|/)$")


HAND_WRITTEN = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), ROOT / "DEPLOY.md", ROOT / "emulator" / "README.md",
                ROOT / "bench" / "README.md"]
"""The pages a reader is pointed at: their links are checked (every Markdown file is), and so are the repository
paths they quote."""


GENERATED_OUTPUTS = ("infra/models.generated.yaml", "infra/registry/")
"""Git-ignored outputs of scripts/gen_model_stacks.py, which DEPLOY.md describes."""


def test_the_link_check_reads_every_hand_written_page() -> None:
    scanned = set(scanned_files())
    assert [page.relative_to(ROOT).as_posix() for page in HAND_WRITTEN if page not in scanned] == []


def test_every_repository_path_a_page_quotes_exists() -> None:
    top = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    found = []
    for page in HAND_WRITTEN:
        text = FENCE.sub(_blank, page.read_text())
        for m in QUOTED_PATH.finditer(text):
            path, test = m.group(1), m.group(2)
            if path.split("/")[0] not in top or not FILE_LIKE.search(path) or path.startswith(tuple(SKIP_PATHS)):
                continue
            if path.startswith(GENERATED_OUTPUTS):
                continue  # what a command writes (git-ignored): a page may name it before it exists
            matches = list(ROOT.glob(path.rstrip("/"))) if "*" in path else [ROOT / path]
            if not matches or not all(p.exists() for p in matches):
                found.append(f"{page.relative_to(ROOT)}:{_line(text, m.start())}: {path} does not exist")
            elif test and not re.search(rf"def {test}\b", matches[0].read_text()):
                found.append(f"{page.relative_to(ROOT)}:{_line(text, m.start())}: {path} has no {test}")
    assert not found, "\n".join(found)


NAMED_SECTION = re.compile(r"([\w/.-]+\.md)\)?,? \"([^\"]+)\"")
"""A section named in prose: ``docs/api.md, "Webhooks"`` (the heading starts with the quoted words)."""


def test_every_section_a_page_names_exists() -> None:
    found = []
    for page in HAND_WRITTEN:
        text = FENCE.sub(_blank, page.read_text())
        for m in NAMED_SECTION.finditer(text):
            candidates = [ROOT / m.group(1), page.parent / m.group(1), DOCS / Path(m.group(1)).name]
            target = next((c for c in candidates if c.is_file()), None)
            headings = [h.group(1) for h in HEADING.finditer(target.read_text())] if target else []
            if not any(h.startswith(m.group(2)) or h.strip("`") == m.group(2) for h in headings):
                found.append(f"{page.relative_to(ROOT)}:{_line(text, m.start())}: {m.group(1)} has no section "
                             f"{m.group(2)!r}")
    assert not found, "\n".join(found)


# ------------------------------------------------------------------ the checks themselves find what they must


def test_the_checks_find_each_way_out_of_the_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    up = ".." + "/"  # spelled so that this file does not cite a parent folder itself
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "ok.md").write_text("# Title\n\n## A `code` heading, here\n")
    owner = "DES" + "IGN.md"
    (repo / "mod.py").write_text(f'"""See {owner} section 3."""\nPATH = "{up * 2}elsewhere/file"\n')
    (repo / "conf.yaml").write_text("# as " + "sha" + "red/notes say\nkey: value\n")
    (repo / "docs" / "page.md").write_text(
        "# Page\n\n"
        f"[up]({up * 2}outside.md) [web](https://example.com/x) <https://example.org>\n"
        f"[fine](ok.md#a-code-heading-here) [top]({up}mod.py) [self](#page)\n"
        "[gone](missing.md) [bad anchor](ok.md#nope)\n"
        "See https://aws.amazon.com/pricing but not `https://in.code/` or http://127.0.0.1:8080.\n"
        f"```sh\ncurl https://also.in.code/ {up * 3}also-out-in-a-fence\n```\n"
    )
    problems = [p for path in scanned_files(repo) for p in escapes(path, repo)]
    text = "\n".join(problems)
    assert "mod.py:1: cites" in text
    assert f"mod.py:2: '{up * 2}elsewhere/file' leaves the repository" in text
    assert "conf.yaml:1: cites" in text
    assert f"docs/page.md:3: '{up * 2}outside.md' leaves the repository" in text
    assert "docs/page.md:3: link to 'https://example.com/x'" in text
    assert "docs/page.md:3: link to 'https://example.org'" in text
    assert "docs/page.md:6: address 'https://aws.amazon.com/pricing'" in text
    assert f"docs/page.md:8: '{up * 3}also-out-in-a-fence' leaves the repository" in text
    assert "in.code" not in text and "127.0.0.1" not in text
    assert len(problems) == 8, text
    broken = "\n".join(broken_links(repo / "docs" / "page.md", repo))
    assert "'missing.md': no such file" in broken
    assert "'ok.md#nope': no heading with that anchor" in broken
    assert "ok.md#a-code-heading-here" not in broken and "mod.py" not in broken and "#page" not in broken

"""The README says what the code does: the printer columns are the CRD's, the demo's variables are named,
and the figures keep one row per benchmark (earlier rows of the same one live in docs/)."""

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def section(title: str) -> str:
    """The README's text from the heading `title` to the next heading of any level."""
    start = README.index(f"\n{title}\n")
    following = re.search(r"\n#{1,6} ", README[start + len(title) + 2 :])
    return README[start : start + len(title) + 2 + (following.start() if following else len(README))]


def test_the_printer_columns_listed_are_the_crds():
    crd = yaml.safe_load((REPO / "crds" / "inferenceservices.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    (paragraph,) = [p for p in README.split("\n\n") if p.startswith("Printer columns")]
    assert sorted(re.findall(r"\*\*([^*]+)\*\*", paragraph)) == sorted(columns)


def test_every_variable_the_demo_reads_is_named_where_the_demo_is():
    read = set(re.findall(r"\$\{([A-Z_]+):-", (REPO / "scripts" / "demo.sh").read_text()))
    assert read >= {"PORT"}
    two_commands = section("## Two commands")
    assert {v for v in read if f"`{v}`" not in two_commands} == set()


def test_the_figures_keep_one_row_per_benchmark_command():
    rows = [line for line in section("## Figures").splitlines() if line.startswith("| ") and "`" in line]
    scripts = [
        re.search(r"(bench/\w+\.py|scripts/\w+\.sh|tests/\S+\.py|pagedinfer plan)", row.rsplit(" | ", 1)[1])
        for row in rows
    ]
    names = [m.group(1) for m in scripts if m]
    assert len(names) == len(rows) and len(set(names)) == len(names), sorted(names)

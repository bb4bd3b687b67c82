"""An import-linter contract type that holds what the import graph cannot: that some modules pull
no heavy library (torch, DeepSpeed, ColossalAI), nor some module of the project (the trainer's),
into a process merely by being imported.

grimp's graph counts an import inside a function like one at the top of the file, yet a lazy
import is exactly what lets the study's orchestrator, the planner and the analysis run on a login
node without torch. So this contract imports each listed module, and every module below it, in a
fresh Python and reports the forbidden modules that landed in sys.modules and the import chain
that brought each one. Registered in pyproject.toml under [tool.importlinter] contract_types.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from importlinter import Contract, ContractCheck, fields, output

# Run in the child: imports each module in turn and, the first time a forbidden module (or one
# below it) is looked up, records the project modules then executing (the chain). Prints one JSON object.
_PROBE = r"""
import importlib, json, sys

modules, forbidden, roots = json.loads(sys.argv[1])
found = {}


class Watch:
    def find_spec(self, name, path=None, target=None):
        top = next((f for f in forbidden if name == f or name.startswith(f + ".")), None)
        if top is not None and top not in found:
            chain = []
            frame = sys._getframe(1)
            while frame is not None:
                module = frame.f_globals.get("__name__", "")
                if module.partition(".")[0] in roots and module not in chain:
                    chain.append(module)
                frame = frame.f_back
            found[top] = list(reversed(chain))
        return None  # the normal finders do the import


sys.meta_path.insert(0, Watch())
failed = {}
for module in modules:
    try:
        importlib.import_module(module)
    except Exception as error:  # noqa: BLE001  (any failure to import is a finding)
        failed[module] = f"{type(error).__name__}: {error}"
print(json.dumps({"found": found, "failed": failed}))
"""


class ImportTimeForbiddenContract(Contract):
    """Options: modules (each, with its submodules, imported in a fresh process) and
    forbidden_modules (modules that must not be imported as a side effect, each with the modules
    below it: `torch`, or `vit_scale.distributed.base`)."""

    type_name = "import_time_forbidden"

    modules = fields.ListField(subfield=fields.StringField())
    forbidden_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        missing = [m for m in self.modules if m not in graph.modules]
        # the chain names the modules of these packages: the listed ones' and the forbidden project ones'
        roots = sorted({m.partition(".")[0] for m in [*self.modules, *self.forbidden_modules] if m in graph.modules})
        env = dict(os.environ)
        # the checkout first, ahead of any installed copy of the project
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p)
        findings = []
        for listed in self.modules:
            if listed in missing:
                continue
            # a package's own modules too; __main__ modules run a program when imported
            tree = sorted({listed, *graph.find_descendants(listed)})
            tree = [m for m in tree if not m.endswith(".__main__")]
            output.verbose_print(verbose, f"Importing {listed} ({len(tree)} modules) in a fresh process...")
            proc = subprocess.run(
                [sys.executable, "-c", _PROBE, json.dumps([tree, self.forbidden_modules, roots])],
                capture_output=True,
                text=True,
                env=env,
                timeout=600,
            )
            try:
                result = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                findings.append((listed, f"could not be checked: {proc.stderr.strip()[-500:]}"))
                continue
            for heavy, chain in sorted(result["found"].items()):
                findings.append((listed, f"imports {heavy} at import time: {' -> '.join([*chain, heavy])}"))
            for module, error in sorted(result["failed"].items()):
                findings.append((listed, f"{module} fails to import: {error}"))
        findings += [(m, "does not exist") for m in missing]
        return ContractCheck(kept=not findings, metadata={"findings": findings})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for listed, finding in check.metadata["findings"]:
            output.print_error(f"{listed} {finding}", bold=False)
            output.new_line()

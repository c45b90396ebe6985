"""Ship the top-level ``templates/`` and ``sites/`` inside the wheel.

In the repository they live at the top level (the product layout); a wheel installed outside the
checkout finds them as package data under ``hpcppo/_resources``. ``hpcppo.resources`` looks in the
checkout first, then in the package.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent
RESOURCE_DIRS = ("templates", "sites", "examples")


class BuildPyWithResources(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        target = Path(self.build_lib) / "hpcppo" / "_resources"
        for name in RESOURCE_DIRS:
            src = ROOT / name
            if not src.is_dir():
                # A wheel without its templates or sites would fail at the first compile: refuse to build it.
                raise SystemExit(f"hpcppo build: resource directory {src} is missing (is MANIFEST.in complete?)")
            shutil.copytree(src, target / name, dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithResources})

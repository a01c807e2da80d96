"""The Debian tools the tests drive for real, and the package each comes from: one list for
`make test` (which stops before pytest, naming what is missing and how to install it),
`.ci/run` (which installs what this prints) and the tests themselves (which fail, never skip,
where one is missing: a skipped test proves nothing). Standard library only, so that
`.ci/run` can ask before anything else is installed.

    python3 tests/tools.py            # the packages missing here, one per line
    python3 tests/tools.py --check    # exit 1 with one message when any is missing
"""
from __future__ import annotations

import shutil
import sys

# tool -> Debian package
TOOLS = {
    "prometheus": "prometheus", "promtool": "prometheus",
    "victoria-metrics": "victoria-metrics", "vmalert": "victoria-metrics",
    "prometheus-alertmanager": "prometheus-alertmanager", "amtool": "prometheus-alertmanager",
    "openssl": "openssl",
    "chromium": "chromium", "chromedriver": "chromium-driver",
}


def missing_packages() -> list[str]:
    return sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})


def install_line(packages: list[str]) -> str:
    return f"sudo apt-get install -y {' '.join(packages)}"


def main(argv: list[str]) -> int:
    packages = missing_packages()
    if "--check" not in argv:
        print("\n".join(packages))
        return 0
    if packages:
        print(f"make test runs real {', '.join(packages)} and they are not installed here: "
              f"{install_line(packages)} (Debian and Ubuntu; .ci/run does it)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

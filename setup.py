"""Maps the product's fixed folders onto one import namespace: services/ -> baton.services, kernels/ -> baton.kernels."""
from setuptools import find_packages, setup

ROOTS = ("services", "kernels", "operators", "loadtest")

packages: list[str] = []
package_dir: dict[str, str] = {}
for root in ROOTS:
    package_dir[f"baton.{root}"] = root
    packages.append(f"baton.{root}")
    packages += [f"baton.{root}.{sub}" for sub in find_packages(root)]

setup(packages=packages, package_dir=package_dir, package_data={"baton.services.engine": ["assets/*"]})

"""Maps the product's fixed folders onto one import namespace: services/ -> baton.services, kernels/
-> baton.kernels, proto/baton/v1 -> baton.v1."""
from setuptools import find_packages, setup

ROOTS = ("services", "kernels", "operators", "loadtest")

packages: list[str] = []
package_dir: dict[str, str] = {}
for root in ROOTS:
    package_dir[f"baton.{root}"] = root
    packages.append(f"baton.{root}")
    packages += [f"baton.{root}.{sub}" for sub in find_packages(root)]
# Generated gRPC stubs import themselves as the proto package (baton.v1), so that is their import
# name.
packages.append("baton.v1")
package_dir["baton.v1"] = "proto/baton/v1"

setup(packages=packages, package_dir=package_dir,
      package_data={"baton.services.checkpoints": ["assets/*"]})

#!/usr/bin/env python3
"""Builds core/data/catalog-us-east-1.json from the EC2 reference data.

Facts only: instance-type shapes, zone offerings and prices, converted from
../shared/data (see its README for the sources), and the network and EBS bandwidth of
each type from tools/data/ec2-bandwidth.json (its "sources" say where each came from).
Run from the repository root:

    python3 tools/build_catalog.py ../shared/data core/data/catalog-us-east-1.json

The output format is documented in docs/catalog.md; `dovetail plan --catalog` reads the same.
"""
import json
import statistics
import sys

REGION = "us-east-1"
# Neuron device names and cores per device, as DescribeInstanceTypes reports them.
NEURON = {
    "inf1": ("Inferentia", 4),
    "inf2": ("Inferentia2", 2),
    "trn1": ("Trainium", 2),
    "trn1n": ("Trainium", 2),
    "trn2": ("Trainium2", 8),
    "trn2u": ("Trainium2", 8),
}
DEFAULT_SPOT_RATIO = 0.37
BANDWIDTH = "tools/data/ec2-bandwidth.json"


def main(src, out):
    types = json.load(open(f"{src}/ec2-instance-types.json"))
    offerings = json.load(open(f"{src}/ec2-offerings.json"))["regions"][REGION]
    prices = json.load(open(f"{src}/ec2-prices-us-east-1.json"))["regions"][REGION]
    spot = json.load(open(f"{src}/ec2-spot-prices-sample.json"))["rows"]
    bandwidth = json.load(open(BANDWIDTH))

    ratios = {}
    for row in spot:
        if row["region"] != REGION or not row.get("on_demand_us_east_1_2026"):
            continue
        ratios.setdefault(row["instance_type"], []).append(row["last_price"] / row["on_demand_us_east_1_2026"])

    zones_by_type = offerings["zones_by_type"]
    catalog = {
        "format": "dovetail-catalog/v1",
        "region": REGION,
        "sources": "ec2-instance-types.json, ec2-offerings.json, ec2-prices-us-east-1.json, "
        "ec2-spot-prices-sample.json (spot = on-demand x the type's median sampled spot/on-demand "
        f"ratio, else {DEFAULT_SPOT_RATIO}); {BANDWIDTH}",
        "zones": [{"name": z, "id": offerings["zone_name_to_id_inferred"][z]} for z in offerings["zones"]],
        "instance_types": [],
    }
    for t in sorted(types, key=lambda t: t["name"]):
        zones = zones_by_type.get(t["name"], [])
        if not zones:
            continue
        arch = "amd64" if "amd64" in t["arch"] else (t["arch"][0] if t["arch"] else "unknown")
        od = prices.get(t["name"])
        sp = None
        if od is not None and "spot" in t["supported_usage_classes"]:
            r = ratios.get(t["name"])
            ratio = statistics.median(r) if r else DEFAULT_SPOT_RATIO
            sp = round(od * ratio, 6)
        it = {
            "name": t["name"],
            "vcpu": t["vcpu"],
            "memory_mib": t["memory_mib"],
            "arch": arch,
            "cpu_manufacturer": t["processor_manufacturer"],
            "sustained_clock_ghz": t["sustained_clock_ghz"],
            "hypervisor": t["hypervisor"],
            "bare_metal": t["bare_metal"],
            "burstable": t["burstable"],
            "enis": t["network_enis_default_card"],
            "ipv4_per_eni": t["ipv4_per_eni"],
            "branch_enis": t["branch_enis"] if t["trunking_compatible"] else None,
            "efa": 1 if t["efa_supported"] else 0,
            "local_nvme_gb": t["local_nvme_gb"],
            "local_storage_gb": t["local_storage_gb"],
            "network_bandwidth_mbps": bandwidth["network_mbps"].get(t["name"]),
            "ebs_bandwidth_mbps": bandwidth["ebs_mbps"].get(t["name"]),
            "usage_classes": [u for u in t["supported_usage_classes"] if u in ("on-demand", "spot")],
            "zones": sorted(zones),
            "on_demand_price": od,
            "spot_price": sp,
        }
        if t["gpu_count"]:
            it["gpu"] = {
                "name": t["gpu_name"],
                "manufacturer": t["gpu_manufacturer"],
                "count": t["gpu_count"],
                "memory_mib": t["gpu_memory_mib"] // t["gpu_count"],
            }
        if t["neuron_device_count"]:
            name, cores = NEURON.get(t["family"], ("Neuron", 1))
            it["neuron"] = {"name": name, "devices": t["neuron_device_count"], "cores_per_device": cores}
        catalog["instance_types"].append(it)
    with open(out, "w") as f:
        json.dump(catalog, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(catalog['instance_types'])} instance types to {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

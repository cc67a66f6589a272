"""How moto's DescribeInstances slows with terminated instances (docs/benchmarks.md, issue 15).

20 rounds of 150 instances launched, described (filtered by a cluster tag and live states, and
unfiltered), then terminated. Run with the venv's python; MOTO_SERVER is the server to start
(default: scripts/moto-server, which forgets terminated instances after
DOVETAIL_MOTO_TERMINATED_TTL seconds; moto's own `moto_server` keeps them).
"""
import os
import subprocess
import time

import boto3

here = os.path.dirname(os.path.abspath(__file__))
server = os.environ.get("MOTO_SERVER", os.path.join(here, "moto-server"))
port = os.environ.get("MOTO_PORT", "5999")
proc = subprocess.Popen([server, "-p", port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    time.sleep(3)
    ec2 = boto3.client("ec2", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                       aws_access_key_id="x", aws_secret_access_key="x")
    ami = ec2.describe_images()["Images"][0]["ImageId"]
    tag = [{"ResourceType": "instance", "Tags": [{"Key": "kubernetes.io/cluster/t", "Value": "owned"}]}]
    live = [{"Name": "tag-key", "Values": ["kubernetes.io/cluster/t"]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]}]
    for r in range(20):
        ids = []
        for _ in range(3):
            out = ec2.run_instances(ImageId=ami, MinCount=50, MaxCount=50, InstanceType="m5.large", TagSpecifications=tag)
            ids += [i["InstanceId"] for i in out["Instances"]]
        t = time.time()
        ec2.describe_instances(Filters=live)
        filtered = time.time() - t
        t = time.time()
        ec2.describe_instances()
        full = time.time() - t
        print(f"round {r + 1}: {len(ids)} live, filtered describe {filtered:.3f} s, unfiltered {full:.3f} s", flush=True)
        ec2.terminate_instances(InstanceIds=ids)
finally:
    proc.terminate()

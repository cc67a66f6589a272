"""moto's server, with EC2's forgetting of terminated instances, and its tags safe to read
while another request writes them.

EC2 lists a terminated instance for about an hour, then forgets it; moto keeps every one for
its life, and its DescribeInstances walks them all, filters or not (a filtered describe of 150
live instances: 0.26 s with none terminated, 2.3 s with 3,000; see docs/benchmarks.md). A test
that launches and terminates thousands of instances (the 20 x 1,000 HA load test) would
measure moto slowing, not dovetail. This starts moto's own server and, beside it, forgets
reservations whose every instance has been terminated for DOVETAIL_MOTO_TERMINATED_TTL seconds
(3600 by default: EC2's hour). Arguments are moto_server's.

moto serves each request on a thread of its own, and its tag store is a dict of dicts that
describe_tags walks while CreateTags on another thread adds to one of the inner dicts:
"RuntimeError: dictionary changed size during iteration", answered as a bare HTTP 500. Every
reply that lists tagged objects reads their tags through describe_tags, so an unfiltered
DescribeImages (1,300 images, each walking the whole store) failed now and then while other
tests tagged their instances. Here every read and write of the tag store holds one lock.
"""

import os
import sys
import threading
import time

from moto.ec2.models import ec2_backends
from moto.ec2.models.tags import TagBackend
from moto.server import main

# One lock over moto's EC2 tag store: its readers walk the inner dicts its writers change.
TAGS = threading.RLock()


def locked(method):
    def call(self, *args, **kwargs):
        with TAGS:
            return method(self, *args, **kwargs)

    call.__name__ = method.__name__
    call.__doc__ = method.__doc__
    return call


for _name in ("create_tags", "delete_tags", "delete_tag_keys", "describe_tags"):
    setattr(TagBackend, _name, locked(getattr(TagBackend, _name)))

TTL = float(os.environ.get("DOVETAIL_MOTO_TERMINATED_TTL", "3600"))
EVERY = min(30.0, max(1.0, TTL / 4))


def forget_terminated():
    # instance id -> when it was first seen terminated (moto keeps no such time)
    terminated_since = {}
    # instance ids whose reservation went at the last pass: their tags go at this one. A
    # DescribeInstances that filtered by tag before the reservation went renders the instances
    # it kept afterwards, with their tags read again; they must still be there then.
    untag = []
    while True:
        time.sleep(EVERY)
        now = time.monotonic()
        try:
            for account in list(ec2_backends.keys()):
                for region in list(ec2_backends[account].keys()):
                    backend = ec2_backends[account][region]
                    with TAGS:
                        for i in untag:
                            backend.tags.pop(i, None)
            untag = []
            for account in list(ec2_backends.keys()):
                for region in list(ec2_backends[account].keys()):
                    backend = ec2_backends[account][region]
                    # moto's readers of instances iterate a copy of the reservations
                    # (all_reservations), so deleting from it is safe for them; the tags are
                    # changed under the tag store's lock above. The Tagging API's
                    # iter_tagged_resources iterates the reservations directly (dovetail does
                    # not call it).
                    for rid, reservation in list(backend.reservations.items()):
                        instances = list(reservation.instances)
                        if not instances or any(i.state != "terminated" for i in instances):
                            continue
                        seen = [terminated_since.setdefault(i.id, now) for i in instances]
                        if now - max(seen) < TTL:
                            continue
                        backend.reservations.pop(rid, None)
                        for i in instances:
                            terminated_since.pop(i.id, None)
                            untag.append(i.id)
        except Exception as e:  # a pass that failed is tried again at the next
            print(f"moto_server.py: forgetting terminated instances failed: {e!r}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    threading.Thread(target=forget_terminated, daemon=True).start()
    main(sys.argv[1:])

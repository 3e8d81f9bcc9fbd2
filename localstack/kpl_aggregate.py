#!/usr/bin/env python3
"""Aggregates user records with AWS's reference KPL aggregator (aws-kinesis-agg, installed by
localstack/kpl-agg-install), for the tests of the spout's de-aggregation.

stdin:  {"aggregates": [[{"partition_key": "k", "explicit_hash_key": "123" or null,
                           "data_hex": "..."}, ...], ...]}
stdout: [{"partition_key": "...", "explicit_hash_key": "..." or null, "data_hex": "..."}, ...]
        one aggregated Kinesis record per input group, as RecordAggregator.clear_and_get() packs it.
"""
import json
import sys

from aws_kinesis_agg.aggregator import RecordAggregator


def main():
    request = json.load(sys.stdin)
    out = []
    for group in request["aggregates"]:
        agg = RecordAggregator()
        for r in group:
            full = agg.add_user_record(r["partition_key"], bytes.fromhex(r["data_hex"]),
                                       r.get("explicit_hash_key"))
            if full is not None:
                sys.exit("a group does not fit in one aggregated record (1 MB): send fewer records per group")
        pk, ehk, data = agg.clear_and_get().get_contents()
        out.append({"partition_key": pk, "explicit_hash_key": ehk or None,
                    "data_hex": data.hex()})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

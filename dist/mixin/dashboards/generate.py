#!/usr/bin/env python3
"""Writes the mixin's Grafana dashboards (dbcage-fleet.json, dbcage-tenant.json) next to this file.

The JSON files are committed; edit this script and run it (python3 generate.py) rather than
editing them by hand. Both dashboards select hosts by the `job` and `instance` variables and
keep `instance` in every aggregation, so hosts are never summed together.
"""
import json
import os

DS = {"type": "prometheus", "uid": "${datasource}"}
HOST = 'job=~"$job", instance=~"$instance"'
TENANT = HOST + ', tenant=~"$tenant"'


def target(expr, legend="", ref="A", instant=False, table=False):
    t = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}
    if instant:
        t["instant"] = True
        t["range"] = False
    if table:
        t["format"] = "table"
    return t


# Limit lines are dashed, unfilled and thicker, so that they never look like usage.
LIMIT_OVERRIDE = {
    "matcher": {"id": "byRegexp", "options": ".*limit.*|.*quota.*"},
    "properties": [
        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
        {"id": "custom.fillOpacity", "value": 0},
        {"id": "custom.lineWidth", "value": 2},
    ],
}


class Layout:
    def __init__(self):
        self.panels = []
        self.y = 0
        self.x = 0
        self.row_h = 0
        self.next_id = 1

    def row(self, title):
        if self.x:
            self.y += self.row_h
            self.x = 0
        self.panels.append({"type": "row", "title": title, "id": self.next_id, "collapsed": False,
                            "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1}, "panels": []})
        self.next_id += 1
        self.y += 1
        self.row_h = 0

    def add(self, panel, w=12, h=8):
        if self.x + w > 24:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0
        panel["id"] = self.next_id
        self.next_id += 1
        panel["gridPos"] = {"x": self.x, "y": self.y, "w": w, "h": h}
        panel.setdefault("datasource", DS)
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def timeseries(title, targets, unit, description="", limits=False, min_=None, max_=None, bars=False):
    custom = {"fillOpacity": 10, "showPoints": "never", "lineWidth": 1}
    if bars:
        custom.update({"drawStyle": "bars", "fillOpacity": 80})
    defaults = {"unit": unit, "custom": custom}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    return {
        "type": "timeseries", "title": title, "description": description, "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": [LIMIT_OVERRIDE] if limits else []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
    }


def stat(title, expr, unit="short", description="", thresholds=None):
    return {
        "type": "stat", "title": title, "description": description,
        "targets": [target(expr, instant=True)],
        "fieldConfig": {"defaults": {"unit": unit, "thresholds": thresholds or {
            "mode": "absolute", "steps": [{"color": "green", "value": None}]}}, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background"},
    }


def ratio_thresholds():
    return {"mode": "absolute", "steps": [
        {"color": "green", "value": None}, {"color": "orange", "value": 0.8}, {"color": "red", "value": 0.95}]}


def table(title, columns, keys, description=""):
    """An instant table: one row per `keys`, one column per (header, expr, unit, thresholds)."""
    targets, overrides, rename = [], [], {}
    for i, (header, expr, unit, thr) in enumerate(columns):
        ref = chr(ord("A") + i)
        targets.append(target(expr, ref=ref, instant=True, table=True))
        rename[f"Value #{ref}"] = header
        props = [{"id": "unit", "value": unit}]
        if thr:
            props += [{"id": "thresholds", "value": thr},
                      {"id": "custom.cellOptions", "value": {"type": "color-background"}}]
        overrides.append({"matcher": {"id": "byName", "options": header}, "properties": props})
    return {
        "type": "table", "title": title, "description": description, "targets": targets,
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {
                "excludeByName": {"Time": True, "__name__": True},
                "indexByName": {k: i for i, k in enumerate(keys)},
                "renameByName": rename}},
        ],
        "fieldConfig": {"defaults": {}, "overrides": overrides},
        "options": {"showHeader": True, "sortBy": [{"displayName": columns[0][0], "desc": True}]},
    }


def variables(with_tenant):
    v = [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
        {"name": "job", "type": "query", "datasource": DS, "label": "job",
         "query": "label_values(dbcage_build_info, job)", "refresh": 2, "includeAll": True,
         "multi": True, "current": {"text": "All", "value": "$__all"}},
        {"name": "instance", "type": "query", "datasource": DS, "label": "instance",
         "query": 'label_values(dbcage_build_info{job=~"$job"}, instance)', "refresh": 2,
         "includeAll": True, "multi": True, "current": {"text": "All", "value": "$__all"}},
    ]
    if with_tenant:
        v.append({"name": "tenant", "type": "query", "datasource": DS, "label": "tenant",
                  "query": f'label_values(dbcage_processes{{{HOST}}}, tenant)', "refresh": 2,
                  "includeAll": True, "multi": True, "current": {"text": "All", "value": "$__all"}})
    return {"list": v}


def dashboard(title, uid, layout, with_tenant, description):
    return {
        "title": title, "uid": uid, "description": description, "tags": ["dbcage"],
        "schemaVersion": 38, "version": 1, "refresh": "30s", "editable": True,
        "time": {"from": "now-3h", "to": "now"}, "timezone": "",
        "templating": variables(with_tenant), "annotations": {"list": []},
        "panels": layout.panels,
    }


def fleet():
    L = Layout()
    L.row("Hosts")
    L.add(stat("Hosts down", f'count(up{{{HOST}}} == 0) or vector(0)',
               thresholds={"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "red", "value": 1}]},
               description="Scrape targets of the selected jobs that do not answer (alert DbcageDown)."), w=6, h=4)
    L.add(stat("Distinct policies in force", f'count(count by (hash) (dbcage_policy_info{{{HOST}}}))',
               description="Hosts that run the same policy files share a hash; more than one means the fleet is not uniform."),
          w=6, h=4)
    L.add(stat("Hosts in rescan-only mode", f'count(dbcage_events_connected{{{HOST}}} == 0) or vector(0)',
               thresholds={"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "orange", "value": 1}]}),
          w=6, h=4)
    L.add(stat("Hosts with stale policy files", f'count(dbcage_policy_stale{{{HOST}}} == 1) or vector(0)',
               thresholds={"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "orange", "value": 1}]}),
          w=6, h=4)
    L.add(table("Daemons", [
        ("version", f'max by (instance, version) (dbcage_build_info{{{HOST}}})', "short", None),
        ("policy hash", f'max by (instance, hash) (dbcage_policy_info{{{HOST}}})', "short", None),
        ("events (1 = connected)", f'max by (instance) (dbcage_events_connected{{{HOST}}})', "short", None),
        ("files differ from policy in force", f'max by (instance) (dbcage_policy_stale{{{HOST}}})', "short",
         {"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "orange", "value": 1}]}),
        ("last reload ok", f'max by (instance) (dbcage_policy_last_reload_successful{{{HOST}}})', "short",
         {"mode": "absolute", "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}]}),
        ("since last scan", f'max by (instance) (time() - dbcage_last_scan_timestamp_seconds{{{HOST}}})', "s", None),
        ("overruns 1h", f'sum by (instance) (increase(dbcage_events_lost_total{{{HOST}}}[1h]))', "short", None),
        ("corrections 1h", f'sum by (instance) (increase(dbcage_kernel_corrections_total{{{HOST}}}[1h]))', "short", None),
        ("apply errors 1h", f'sum by (instance) (increase(dbcage_apply_errors_total{{{HOST}}}[1h]))', "short", None),
        ("runtime overrides", f'count by (instance) (dbcage_override_info{{{HOST}, source="runtime"}})', "short", None),
    ], ["instance"], description="One row per host. A host missing here is down (see Hosts down)."), w=24, h=8)

    L.row("Tenants at a glance")
    L.add(table("Tenants", [
        ("closest limit", f'max by (instance, tenant) (instance_tenant:dbcage_limit_usage:max_ratio5m{{{HOST}}})', "percentunit", ratio_thresholds()),
        ("cpu / quota", f'max by (instance, tenant) (instance_tenant:dbcage_cpu_quota_usage:ratio_rate5m{{{HOST}}})', "percentunit", ratio_thresholds()),
        ("throttled s/s", f'max by (instance, tenant) (instance_tenant:dbcage_cpu_throttled_seconds:rate5m{{{HOST}}})', "s", None),
        ("memory / max", f'max by (instance, tenant) (instance_tenant:dbcage_memory_limit_usage:ratio{{{HOST}}})', "percentunit", ratio_thresholds()),
        ("pressure (some, worst)", f'max by (instance, tenant) (instance_tenant_resource:dbcage_pressure_waiting:ratio_rate5m{{{HOST}}})', "percentunit", ratio_thresholds()),
        ("replication lag", f'max by (instance, tenant) (dbcage_replication_lag_seconds{{{HOST}}})', "s", None),
        ("behind", f'max by (instance, tenant) (dbcage_replication_behind{{{HOST}}})', "short",
         {"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "red", "value": 1}]}),
        ("processes", f'max by (instance, tenant) (dbcage_processes{{{HOST}}})', "short", None),
    ], ["instance", "tenant"],
        description="One row per host and tenant, worst first. Limits are used as 5-minute rates; 95% or more for 30 minutes fires DbcageTenantAtLimit. Pressure is cgroup v2 only."),
        w=24, h=10)
    L.add(timeseries("Tenants closest to a limit", [target(
        f'topk(10, instance_tenant:dbcage_limit_usage:max_ratio5m{{{HOST}}})', "{{instance}} {{tenant}}")],
        "percentunit", min_=0, description="The highest of cpu, memory and per-device IO use against its limit."))
    L.add(timeseries("CPU throttled time per second", [target(
        f'topk(10, instance_tenant:dbcage_cpu_throttled_seconds:rate5m{{{HOST}}})', "{{instance}} {{tenant}}")],
        "s", min_=0, description="Time runnable threads were held back by the quota, summed over CPUs: a multi-threaded tenant can pass 1 s/s."))
    L.add(timeseries("Pressure: share of time some tasks waited", [target(
        f'topk(10, instance_tenant_resource:dbcage_pressure_waiting:ratio_rate5m{{{HOST}}})', "{{instance}} {{tenant}} {{resource}}")],
        "percentunit", min_=0, max_=1, description="PSI 'some' per tenant and resource (cgroup v2 hosts only)."))
    L.add(timeseries("Replication lag", [target(
        f'dbcage_replication_lag_seconds{{{HOST}}}', "{{instance}} {{tenant}}")], "s", min_=0))

    L.row("Daemon health")
    L.add(timeseries("Process events per second", [target(
        f'sum by (instance) (rate(dbcage_events_total{{{HOST}}}[$__rate_interval]))', "{{instance}}")], "ops", min_=0), w=8)
    L.add(timeseries("Processes moved per second", [target(
        f'sum by (instance) (rate(dbcage_moves_total{{{HOST}}}[$__rate_interval]))', "{{instance}}")], "ops", min_=0), w=8)
    L.add(timeseries("Time since the last full scan", [target(
        f'time() - dbcage_last_scan_timestamp_seconds{{{HOST}}}', "{{instance}}")], "s", min_=0,
        description="The periodic rescan runs every 30 s by default; 5 minutes fires DbcageScanStalled."), w=8)
    L.add(timeseries("Event overruns and rescans (per 5 minutes)", [
        target(f'sum by (instance) (increase(dbcage_events_lost_total{{{HOST}}}[5m]))', "{{instance}} overruns", "A"),
        target(f'sum by (instance) (increase(dbcage_rescans_total{{{HOST}}}[5m]))', "{{instance}} rescans", "B")],
        "short", min_=0, bars=True), w=8)
    L.add(timeseries("Reload failures, corrections, apply errors (per hour)", [
        target(f'sum by (instance) (increase(dbcage_reload_failures_total{{{HOST}}}[1h]))', "{{instance}} reload failures", "A"),
        target(f'sum by (instance) (increase(dbcage_kernel_corrections_total{{{HOST}}}[1h]))', "{{instance}} kernel corrections", "B"),
        target(f'sum by (instance) (increase(dbcage_apply_errors_total{{{HOST}}}[1h]))', "{{instance}} apply errors", "C")],
        "short", min_=0), w=8)
    L.add(timeseries("Policy loaded", [target(
        f'dbcage_policy_loaded_timestamp_seconds{{{HOST}}} * 1000', "{{instance}}")], "dateTimeAsIso",
        description="When each host's policy in force was loaded (start or reload)."), w=8)
    return dashboard("dbcage / Fleet", "dbcage-fleet", L, False,
                     "Every host's dbcage and tenants at a glance: limits, throttling, pressure, replication, daemon health.")


def tenant():
    L = Layout()
    L.row("IO")
    for d in ["read", "write"]:
        L.add(timeseries(f"{d.capitalize()} bytes/s against the limit", [
            target(f'sum by (instance, tenant) (rate(dbcage_io_bytes_total{{{TENANT}, direction="{d}"}}[$__rate_interval]))',
                   "{{instance}} {{tenant}} used", "A"),
            target(f'sum by (instance, tenant) (dbcage_io_limit_bytes_per_second{{{TENANT}, direction="{d}"}})',
                   "{{instance}} {{tenant}} limit", "B")], "Bps", limits=True, min_=0,
            description="Used: solid; limit (the sum over the tenant's devices): dashed."))
    L.add(timeseries("IOPS against the limit", [
        target(f'sum by (instance, tenant, direction) (rate(dbcage_io_operations_total{{{TENANT}}}[$__rate_interval]))',
               "{{instance}} {{tenant}} {{direction}} used", "A"),
        target(f'sum by (instance, tenant, direction) (dbcage_io_limit_operations_per_second{{{TENANT}}})',
               "{{instance}} {{tenant}} {{direction}} limit", "B")], "iops", limits=True, min_=0))
    L.add(timeseries("Bytes/s per device", [target(
        f'sum by (instance, tenant, name, direction) (rate(dbcage_io_bytes_total{{{TENANT}}}[$__rate_interval]))',
        "{{instance}} {{tenant}} {{name}} {{direction}}")], "Bps", min_=0))
    L.add(timeseries("Device shares under io.split = demand", [target(
        f'dbcage_io_share_ratio{{{TENANT}}}', "{{instance}} {{tenant}} {{name}} {{direction}}")],
        "percentunit", min_=0, max_=1))
    L.row("CPU and memory")
    L.add(timeseries("CPU cores used against the quota", [
        target(f'sum by (instance, tenant) (rate(dbcage_cpu_usage_seconds_total{{{TENANT}}}[$__rate_interval]))',
               "{{instance}} {{tenant}} used", "A"),
        target(f'dbcage_cpu_quota_cores{{{TENANT}}}', "{{instance}} {{tenant}} quota", "B")],
        "short", limits=True, min_=0))
    L.add(timeseries("CPU throttled time per second", [target(
        f'rate(dbcage_cpu_throttled_seconds_total{{{TENANT}}}[$__rate_interval])', "{{instance}} {{tenant}}")],
        "s", min_=0, description="Summed over CPUs: a multi-threaded tenant can pass 1 s/s."))
    L.add(timeseries("Memory against memory.max", [
        target(f'dbcage_memory_usage_bytes{{{TENANT}}}', "{{instance}} {{tenant}} used", "A"),
        target(f'dbcage_memory_limit_bytes{{{TENANT}}}', "{{instance}} {{tenant}} limit", "B")],
        "bytes", limits=True, min_=0))
    L.add(timeseries("Pressure: share of time some tasks waited", [target(
        f'rate(dbcage_pressure_waiting_seconds_total{{{TENANT}}}[$__rate_interval])', "{{instance}} {{tenant}} {{resource}}")],
        "percentunit", min_=0, max_=1, description="PSI 'some' (cgroup v2 hosts only)."))
    L.add(timeseries("OOM kills", [target(
        f'increase(dbcage_memory_oom_kills_total{{{TENANT}}}[$__rate_interval])', "{{instance}} {{tenant}}")],
        "short", min_=0, bars=True))
    L.add(timeseries("Processes", [target(f'dbcage_processes{{{TENANT}}}', "{{instance}} {{tenant}}")], "short", min_=0))
    L.row("IO latency (kernel, eBPF: dbcage_io_latency_seconds)")
    L.add({
        "type": "heatmap", "title": "IO latency: requests per latency bucket",
        "description": "Time from submission to completion of the selected tenants' IO requests, all devices and operations. "
                       "A band near the throttle's slice under a band of fast requests is the limit at work (seed 000's shape).",
        "targets": [dict(target(
            f'sum by (instance, le) (rate(dbcage_io_latency_seconds_bucket{{{TENANT}}}[$__rate_interval]))', "{{le}}"),
            format="heatmap")],
        "options": {"calculate": False, "yAxis": {"unit": "s"}, "cellGap": 1,
                    "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential"},
                    "tooltip": {"show": True, "yHistogram": True}},
        "fieldConfig": {"defaults": {}, "overrides": []},
    })
    L.add(timeseries("IO latency p50 / p99 per tenant", [
        target(f'histogram_quantile(0.5, sum by (instance, tenant, le) (rate(dbcage_io_latency_seconds_bucket{{{TENANT}}}[$__rate_interval])))',
               "{{instance}} {{tenant}} p50", "A"),
        target(f'histogram_quantile(0.99, sum by (instance, tenant, le) (rate(dbcage_io_latency_seconds_bucket{{{TENANT}}}[$__rate_interval])))',
               "{{instance}} {{tenant}} p99", "B")],
        "s", min_=0, description="Buckets a factor of 4 apart: an estimate; `dbcage iolat TENANT` shows the finer histogram."))
    L.row("Replication guard and overrides")
    L.add(timeseries("Replication lag (bytes)", [target(
        f'dbcage_replication_lag_bytes{{{TENANT}}}', "{{instance}} {{tenant}}")], "bytes", min_=0), w=8)
    L.add(timeseries("Replication lag (time)", [target(
        f'dbcage_replication_lag_seconds{{{TENANT}}}', "{{instance}} {{tenant}}")], "s", min_=0), w=8)
    L.add(timeseries("Guard: behind, write limits raised", [
        target(f'dbcage_replication_behind{{{TENANT}}}', "{{instance}} {{tenant}} behind", "A"),
        target(f'dbcage_replication_raised{{{TENANT}}}', "{{instance}} {{tenant}} raised", "B")],
        "bool_on_off", min_=0, max_=1), w=8)
    L.add(table("Limits overridden (dbcage set, schedule windows)", [
        ("in force", f'max by (instance, tenant, key, source) (dbcage_override_info{{{TENANT}}})', "short", None)],
        ["instance", "tenant", "key", "source"]), w=24, h=6)
    return dashboard("dbcage / Tenant", "dbcage-tenant", L, True,
                     "One or more tenants on one or more hosts: IO, CPU and memory against their limits, pressure, the replication guard.")


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    for name, d in [("dbcage-fleet.json", fleet()), ("dbcage-tenant.json", tenant())]:
        with open(os.path.join(here, name), "w") as f:
            json.dump(d, f, indent=2)
            f.write("\n")

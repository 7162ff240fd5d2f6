//! The only skips the integration tests may take: a test that cannot run for any other reason
//! fails (`common::cannot_run`). Each entry names the test, the condition it reports (a prefix
//! of its reason) and why a user would accept that it did not run. Keep this list short: a
//! missing tool is installed by `scripts/test.sh`, never declared here.

pub struct DeclaredSkip {
    /// The test's name as libtest prints it (`module::function`).
    pub test: &'static str,
    /// The start of the reason the test gives.
    pub reason: &'static str,
    /// Why skipping is acceptable.
    pub why: &'static str,
}

pub const DECLARED: &[DeclaredSkip] = &[
    DeclaredSkip {
        test: "daemon::daemon_moves_a_process_out_of_the_cpuset_of_the_pinned_tenant_it_leaves",
        reason: "cgroup v1 only",
        why: "on cgroup v2 one tree holds every controller: a process that changes tenant moves \
              to its new tenant's group and leaves the old one whole; the plan's choice of what \
              to leave is unit-tested (plan::tests::a_process_that_leaves_a_pinned_tenant_leaves_its_cpuset_and_memory_groups)",
    },
    DeclaredSkip {
        test: "lifecycle::an_io_only_tenant_keeps_its_processes_cpuset_and_memory_groups",
        reason: "cgroup v1 only",
        why: "on cgroup v2 one tree holds every controller, so a tenant's group is the same one \
              whatever its limits use; the plan's choice of hierarchies is unit-tested \
              (plan::tests::an_io_only_tenant_has_no_cpuset_or_memory_group)",
    },
    DeclaredSkip {
        test: "control::set_swaps_cpus_between_busy_tenants",
        reason: "needs 2 cpus",
        why: "a host with one cpu cannot give two tenants cpus of their own",
    },
    DeclaredSkip {
        test: "pg_bench::pg_noisy_neighbour_cpu",
        reason: "needs 2 cpus",
        why: "a host with one cpu cannot pin two clusters apart",
    },
    DeclaredSkip {
        test: "iolat::iolat_shows_the_throttle_wait_at_200_iops",
        reason: "the kernel refuses fentry programs",
        why: "with lockdown or a BPF LSM the kernel refuses fentry, and no block tracepoint comes \
              before the throttle, so its wait cannot be told apart; the limit and the count are \
              still checked here, the wait's shape in the v2 VM (tests/vm/iolat.sh)",
    },
    DeclaredSkip {
        test: "import::imported_policy_gives_the_kernel_values_cgconfigparser_gives",
        reason: "cgroup v1 only",
        why: "libcgroup's cgconfig.conf and cgrules.conf describe v1 hierarchies (cgconfigparser \
              writes blkio.throttle and cpu.cfs files): on a pure v2 host there is no such \
              setup to import; the import's parsing is unit-tested",
    },
    DeclaredSkip {
        test: "lifecycle::a_fork_into_the_group_during_its_moves_follows_its_parent",
        reason: "cgroup v2 only",
        why: "on cgroup v1 a group may hold processes and children at once, so no write is \
              refused for a process forked into it; the test runs on v2 in the systemd guest \
              (tests/sdguest/it.sh runs lifecycle::)",
    },
];

/// The `why` of the entry that allows `test` to skip for `reason`, if any.
pub fn declared(test: &str, reason: &str) -> Option<&'static str> {
    DECLARED
        .iter()
        .find(|d| d.test == test && reason.starts_with(d.reason))
        .map(|d| d.why)
}

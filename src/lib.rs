//! dbcage: a resource governor for database instances that share one Linux host.
//!
//! Flow (see ARCHITECTURE.md, which also gives the layers a module may import from): policy +
//! inventory + snapshot → plan (pure) → apply, all through `engine`; the cgroup drivers own both
//! the writes of a limit and the readers of what is in force. `main.rs` is a thin CLI over `cli`.

pub mod agent;
pub mod balance;
pub mod bpf;
pub mod cgroup;
pub mod classify;
pub mod cli;
pub mod control;
pub mod engine;
pub mod favordynmods;
pub mod hostfs;
pub mod import;
pub mod inventory;
pub mod iocost;
pub mod iolat;
pub mod kernel;
pub mod metrics;
pub mod plan;
pub mod policy;
pub mod probe;
pub mod protect;
pub mod replication;
pub mod rundir;
pub mod status;
pub mod systemd;
pub mod threads;
pub mod top;
pub mod unitname;
pub mod units;
pub mod usage;
pub mod web;

#[cfg(test)]
mod tests_architecture;
#[cfg(test)]
pub(crate) mod tests_snapshot;

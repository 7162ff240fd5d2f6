//! dbcage: a resource governor for database instances that share one Linux host.
//!
//! Flow (see ARCHITECTURE.md): policy → inventory → plan (pure) → apply (the only writer),
//! with stats readers for status. `main.rs` is a thin CLI over `cli`.

pub mod agent;
pub mod balance;
pub mod cgroup;
pub mod classify;
pub mod cli;
pub mod control;
pub mod engine;
pub mod hostfs;
pub mod import;
pub mod inventory;
pub mod kernel;
pub mod metrics;
pub mod plan;
pub mod policy;
pub mod probe;
pub mod replication;
pub mod rundir;
pub mod status;
pub mod top;
pub mod units;
pub mod usage;

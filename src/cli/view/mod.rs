//! What the commands print for people: the plan, the status table, the daemon's state. Text
//! only; `--json` output is the serialized values themselves.

pub mod daemon;
pub mod plan;
pub mod status;

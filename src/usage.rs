//! The error that means "the input is wrong, nothing was changed": a command line, a request or
//! a probe argument refused before anything was touched. The command line exits 2 on it (and on
//! `policy::PolicyErrors`).

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

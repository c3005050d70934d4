//! The part of the `trainmem` command line that `cargo xtask` shares: the `scenario` command
//! ([`scenario_command`]). Every other subcommand lives in the `trainmem` binary alone.

#![forbid(unsafe_code)]

pub mod scenario_command;

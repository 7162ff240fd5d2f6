use std::process::ExitCode;

fn main() -> ExitCode {
    dbcage::cli::main()
}

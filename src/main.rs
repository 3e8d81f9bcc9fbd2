//! The `squall` binary: see `squall --help`.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    squall::logging::init_with("warn");
    let cli = squall::cli::Cli::parse();
    match squall::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

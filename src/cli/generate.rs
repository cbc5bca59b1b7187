//! `capexec completions` and `capexec man`: generated from the clap
//! definitions at run time, so they always describe the binary that
//! prints them (a build step would need the definitions in build.rs too,
//! and packagers can run the subcommand just as well).

use std::path::PathBuf;

use clap::Args;

use crate::cli::{EXIT_CAPEXEC_FAILURE, stdio};

#[derive(Args, Debug)]
pub struct CompletionArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write capexec.1 and capexec-SUBCOMMAND.1 into DIR instead of
    /// printing capexec.1.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

pub fn completions_main(args: CompletionArgs) -> i32 {
    let shell = match args.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut command = crate::cli::command();
    // Into memory first: clap_complete panics on a write error.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "capexec", &mut script);
    stdio::print_answer(script, "the completion script")
}

pub fn man_main(args: ManArgs) -> i32 {
    // The version alone: `--version`'s second line (the protocol's
    // features) would end the .TH line's quoted field, and roff would
    // print it above NAME.
    let command = crate::cli::command()
        .version(env!("CARGO_PKG_VERSION"))
        .propagate_version(true);
    let Some(dir) = &args.dir else {
        // Into memory first: a write error is then the one rule's.
        let mut page = Vec::new();
        return match clap_mangen::Man::new(command).render(&mut page) {
            Ok(()) => stdio::print_answer(page, "the man pages to stdout"),
            Err(error) => stdio::unwritten(&error, "the man pages to stdout"),
        };
    };
    let written =
        std::fs::create_dir_all(dir).and_then(|()| clap_mangen::generate_to(command, dir));
    match written {
        Ok(()) => 0,
        Err(error) => {
            eprintln!(
                "capexec: cannot write the man pages to {}: {}",
                dir.display(),
                capexec::model::io_message(&error)
            );
            EXIT_CAPEXEC_FAILURE
        }
    }
}

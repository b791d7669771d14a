//! The `dynamo-run` binary: everything is in the library's [`dynamo_run::run_cli`].

fn main() {
    let args: Vec<String> = std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()).collect();
    std::process::exit(dynamo_run::run_cli(args));
}

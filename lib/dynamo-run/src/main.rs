//! `dynamo-run`: the inputs and engines arrive with the LLM serving work; for now the
//! binary reports its version and says what it cannot do yet.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--version" || a == "-V") {
        println!("dynamo-run {}", dynamo_llm::VERSION);
        return;
    }
    eprintln!("dynamo-run {}: no engines are available in this build yet", dynamo_llm::VERSION);
    std::process::exit(2);
}

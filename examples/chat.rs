//! Chat with a Qwen2 / Qwen2.5 model from a Hugging Face folder.
//!
//! ```text
//! cargo run --release --example chat -- --model DIR [--device cuda] [--dtype bf16]
//!     [--system TEXT] [--max-new-tokens N] [--greedy | --temperature T --top-k K --top-p P
//!     --min-p P --repetition-penalty R --seed S] [--stop TEXT]...
//!     [--prompt TEXT] [--json] [--ids 1,2,3]
//! ```
//!
//! Interactive by default: type a message, the reply streams as it is generated, then its
//! token count, tokens/s and time to first token; `/reset` forgets the conversation, `/exit`
//! (or end of input) quits. `--prompt` runs one turn and exits; `--json` prints the generated
//! ids and text as JSON; `--ids` continues raw token ids with no tokenizer or template (for a
//! folder with only config and weights). Sampling defaults come from the folder's
//! `generation_config.json` (256 new tokens unless it says otherwise); flags override them.

use genesis::generation::{find_stop_string, Generation, GenerationConfig};
use genesis::models::hf::parse_dtype;
use genesis::models::qwen2::Qwen2ForCausalLM;
use genesis::text::{stop_token_ids, ChatTemplate, Message, Tokenizer};
use genesis::{DType, Device, Error, Result};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;

const USAGE: &str = "usage: chat --model DIR [--device D] [--dtype f32|bf16|f16] [--system TEXT] \
[--max-new-tokens N] [--greedy] [--temperature T] [--top-k K] [--top-p P] [--min-p P] \
[--repetition-penalty R] [--seed S] [--stop TEXT]... [--prompt TEXT] [--json] [--ids 1,2,3]";

struct Args {
    model: PathBuf,
    device: String,
    dtype: Option<String>,
    system: Option<String>,
    prompt: Option<String>,
    ids: Option<Vec<u32>>,
    json: bool,
    generation: GenerationConfig,
}

fn parse_args() -> Result<Args> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        std::process::exit(0);
    }
    let model = argv.iter().position(|a| a == "--model").and_then(|i| argv.get(i + 1));
    let model = PathBuf::from(model.ok_or_else(|| Error::invalid(format!("--model DIR is required\n{USAGE}")))?);
    let mut args = Args {
        generation: GenerationConfig::from_folder(&model)?,
        model,
        device: "cpu".into(),
        dtype: None,
        system: None,
        prompt: None,
        ids: None,
        json: false,
    };
    let g = &mut args.generation;
    let mut it = argv.into_iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| Error::invalid(format!("{flag} needs a value\n{USAGE}")));
        fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T> {
            v.parse().map_err(|_| Error::invalid(format!("{flag}: cannot parse {v:?}")))
        }
        match flag.as_str() {
            "--model" => {
                value()?;
            }
            "--device" => args.device = value()?,
            "--dtype" => args.dtype = Some(value()?),
            "--system" => args.system = Some(value()?),
            "--prompt" => args.prompt = Some(value()?),
            "--json" => args.json = true,
            "--ids" => {
                let list = value()?;
                args.ids = Some(list.split(',').map(|s| num(&flag, s.trim().to_string())).collect::<Result<_>>()?);
            }
            "--max-new-tokens" => g.max_new_tokens = num(&flag, value()?)?,
            "--greedy" => g.do_sample = false,
            "--temperature" => (g.temperature, g.do_sample) = (num(&flag, value()?)?, true),
            "--top-k" => (g.top_k, g.do_sample) = (num(&flag, value()?)?, true),
            "--top-p" => (g.top_p, g.do_sample) = (num(&flag, value()?)?, true),
            "--min-p" => (g.min_p, g.do_sample) = (num(&flag, value()?)?, true),
            "--repetition-penalty" => g.repetition_penalty = num(&flag, value()?)?,
            "--seed" => g.seed = Some(num(&flag, value()?)?),
            "--stop" => g.stop_strings.push(value()?),
            other => return Err(Error::invalid(format!("unknown flag {other}\n{USAGE}"))),
        }
    }
    args.generation.validate()?;
    Ok(args)
}

/// What one reply produced.
struct Reply {
    ids: Vec<u32>,
    text: String,
    ttft: f64,
    seconds: f64,
}

/// Generate from `prompt`, streaming text to `out` when a tokenizer is given. Text that could
/// still become a stop string is held back until it cannot.
fn reply(
    model: &Qwen2ForCausalLM,
    tokenizer: Option<&Tokenizer>,
    prompt: &[u32],
    config: &GenerationConfig,
    out: &mut dyn Write,
) -> Result<Reply> {
    let start = Instant::now();
    let mut generation = Generation::new(model, &[prompt.to_vec()], config)?;
    let mut stream = tokenizer.map(|t| t.stream(true));
    let hold = config.stop_strings.iter().map(String::len).max().unwrap_or(1).saturating_sub(1);
    let (mut ids, mut text, mut shown, mut ttft) = (Vec::new(), String::new(), 0usize, None);
    while !generation.is_done() {
        let Some(Some(id)) = generation.step()?.first().copied() else { break };
        ttft.get_or_insert_with(|| start.elapsed().as_secs_f64());
        ids.push(id);
        if config.eos_token_ids.contains(&id) {
            break;
        }
        let Some(stream) = stream.as_mut() else { continue };
        text.push_str(&stream.push(id)?);
        if let Some(cut) = find_stop_string(&text, &config.stop_strings) {
            text.truncate(cut);
            break;
        }
        let mut upto = text.len().saturating_sub(hold).max(shown);
        while !text.is_char_boundary(upto) {
            upto -= 1;
        }
        write!(out, "{}", &text[shown..upto]).ok();
        out.flush().ok();
        shown = upto;
    }
    if let Some(stream) = stream.as_mut() {
        if find_stop_string(&text, &config.stop_strings).is_none() {
            text.push_str(&stream.finish()?);
            if let Some(cut) = find_stop_string(&text, &config.stop_strings) {
                text.truncate(cut);
            }
        }
        write!(out, "{}", &text[shown.min(text.len())..]).ok();
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(Reply { ids, text, ttft: ttft.unwrap_or(seconds), seconds })
}

fn stats(r: &Reply) -> String {
    let decode = r.seconds - r.ttft;
    let rate = if r.ids.len() > 1 && decode > 0.0 { (r.ids.len() - 1) as f64 / decode } else { 0.0 };
    format!("[{} tokens, {rate:.1} tokens/s, time to first token {:.0} ms]", r.ids.len(), r.ttft * 1e3)
}

fn print_json(prompt: &[u32], r: &Reply) {
    let v = serde_json::json!({
        "prompt_ids": prompt, "ids": r.ids, "text": r.text,
        "ttft_ms": r.ttft * 1e3, "seconds": r.seconds,
    });
    println!("{v}");
}

fn main() -> Result<()> {
    let mut args = parse_args()?;
    let device = Device::parse(&args.device)?;
    let default_dtype = if device.backend().name() == "cpu" { DType::F32 } else { DType::BF16 };
    let dtype = args.dtype.as_deref().map(parse_dtype).transpose()?.unwrap_or(default_dtype);
    let load_start = Instant::now();
    let model = Qwen2ForCausalLM::from_pretrained(&args.model, &device, dtype)?;
    if args.generation.eos_token_ids.is_empty() {
        args.generation.eos_token_ids = model.config.eos_token_ids.clone();
    }
    eprintln!(
        "loaded {} ({} parameters, {dtype}) on {device} in {:.1} s",
        args.model.display(),
        genesis::nn::Module::num_parameters(&model),
        load_start.elapsed().as_secs_f64()
    );

    if let Some(ids) = args.ids.clone() {
        // Raw ids: no tokenizer or template needed; text only when the folder has a tokenizer.
        let tokenizer = Tokenizer::from_folder(&args.model).ok();
        if tokenizer.is_none() && !args.generation.stop_strings.is_empty() {
            return Err(Error::invalid("--stop needs a tokenizer.json in the model folder"));
        }
        let r = reply(&model, tokenizer.as_ref(), &ids, &args.generation, &mut std::io::sink())?;
        if args.json {
            print_json(&ids, &r);
        } else {
            println!("{}", r.ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
            eprintln!("{}", stats(&r));
        }
        return Ok(());
    }

    let tokenizer = Tokenizer::from_folder(&args.model)?;
    let template = ChatTemplate::from_folder(&args.model)?;
    for id in stop_token_ids(&args.model)? {
        if !args.generation.eos_token_ids.contains(&id) {
            args.generation.eos_token_ids.push(id);
        }
    }
    let fresh = || -> Vec<Message> { args.system.iter().map(|s| Message::system(s.clone())).collect() };
    let mut history = fresh();

    if let Some(text) = args.prompt.clone() {
        history.push(Message::user(text));
        let ids = tokenizer.encode(&template.render(&history, true)?, false)?;
        let mut sink = std::io::sink();
        let out: &mut dyn Write = if args.json { &mut sink } else { &mut std::io::stdout() };
        let r = reply(&model, Some(&tokenizer), &ids, &args.generation, out)?;
        if args.json {
            print_json(&ids, &r);
        } else {
            println!();
            eprintln!("{}", stats(&r));
        }
        return Ok(());
    }

    eprintln!("type a message; /reset forgets the conversation, /exit quits");
    let stdin = std::io::stdin();
    loop {
        print!("> ");
        std::io::stdout().flush().ok();
        let mut line = String::new();
        if stdin.lock().read_line(&mut line).map_err(|e| Error::invalid(format!("reading input: {e}")))? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history = fresh();
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        history.push(Message::user(line));
        let turn = template
            .render(&history, true)
            .and_then(|prompt| tokenizer.encode(&prompt, false))
            .and_then(|ids| reply(&model, Some(&tokenizer), &ids, &args.generation, &mut std::io::stdout()));
        match turn {
            Ok(r) => {
                println!();
                eprintln!("{}", stats(&r));
                history.push(Message::assistant(r.text));
            }
            Err(e) => {
                // The turn is dropped; the conversation before it stays (e.g. a history too
                // long for the model: /reset starts over).
                history.pop();
                eprintln!("\nerror: {e}");
            }
        }
    }
    Ok(())
}

//! Text for language models from Hugging Face model folders (feature `text`): the
//! tokenizer (`tokenizer.json`), the chat template (`tokenizer_config.json`,
//! `chat_template.jinja`), the ids that stop generation, and streaming detokenization.
//!
//! A chat prompt, as transformers' `apply_chat_template(messages, add_generation_prompt=True)`
//! writes it, then its ids, then the reply decoded as it is generated:
//!
//! ```no_run
//! # fn main() -> genesis::Result<()> {
//! use genesis::text::{stop_token_ids, ChatTemplate, Message, Tokenizer};
//! let dir = "path/to/Qwen2.5-0.5B-Instruct";
//! let tokenizer = Tokenizer::from_folder(dir)?;
//! let template = ChatTemplate::from_folder(dir)?;
//! let prompt = template.render(&[Message::user("Hi! Who are you?")], true)?;
//! let ids = tokenizer.encode(&prompt, false)?;
//! let stop = stop_token_ids(dir)?;
//! let mut stream = tokenizer.stream(true);
//! # let generated: Vec<u32> = vec![];
//! for &id in &generated {
//!     if stop.contains(&id) {
//!         break;
//!     }
//!     print!("{}", stream.push(id)?);
//! }
//! print!("{}", stream.finish()?);
//! # let _ = ids;
//! # Ok(())
//! # }
//! ```
//!
//! Templates work on their own too:
//!
//! ```
//! use genesis::text::{ChatOptions, ChatTemplate, Message};
//! let template = ChatTemplate::from_str(
//!     "{% for m in messages %}<|{{ m.role }}|>{{ m.content.strip() }}\n{% endfor %}\
//!      {% if add_generation_prompt %}<|assistant|>{% endif %}",
//! )?;
//! let text = template.render_with(
//!     &[Message::system("Be brief."), Message::user("  Hello  ")],
//!     &ChatOptions::new().add_generation_prompt(true),
//! )?;
//! assert_eq!(text, "<|system|>Be brief.\n<|user|>Hello\n<|assistant|>");
//! # Ok::<(), genesis::Error>(())
//! ```

mod chat_template;
mod config;
mod pycompat;
mod stream;
mod tokenizer;

pub use chat_template::{ChatOptions, ChatTemplate, Message};
pub use config::{stop_token_ids, NamedTemplate, TokenizerConfig};
pub use stream::TextStream;
pub use tokenizer::Tokenizer;

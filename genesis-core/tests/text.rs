//! `genesis::text`: tokenizer, model-folder configuration, chat templates and streaming
//! detokenization. Inline cases run everywhere; the Qwen2 fixture cases compare with
//! transformers' own output (tests/models/qwen2/reference.json, committed; they fail if it
//! is missing).
#![cfg(feature = "text")]

mod common;

use common::TempDir;
use genesis::text::{stop_token_ids, ChatOptions, ChatTemplate, Message, TextStream, Tokenizer, TokenizerConfig};
use genesis::ErrorKind;
use serde::Deserialize;
use std::path::{Path, PathBuf};

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

/// GPT-2's byte-to-character table of byte-level BPE.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable(b) {
        char::from(b)
    } else {
        let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + rank).unwrap()
    }
}

fn bytes_token(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_char(b)).collect()
}

/// A byte-level BPE tokenizer.json: the 256 byte tokens (id = byte), merges that make some
/// characters span several multi-byte tokens (你 = [E4 BD][A0], 😀 = [F0 9F][98 80]), a few
/// ASCII merges, and the special token `<|end|>`.
fn tiny_tokenizer_json() -> String {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(bytes_token(&[b]), b.into());
    }
    let merges: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (vec![0xE4], vec![0xBD]),
        (vec![0xF0], vec![0x9F]),
        (vec![0x98], vec![0x80]),
        (b"h".to_vec(), b"e".to_vec()),
        (b"l".to_vec(), b"l".to_vec()),
        (b"he".to_vec(), b"ll".to_vec()),
        (b" ".to_vec(), b"w".to_vec()),
    ];
    let mut merge_strings = Vec::new();
    for (a, b) in &merges {
        let (a, b) = (bytes_token(a), bytes_token(b));
        vocab.insert(format!("{a}{b}"), (vocab.len() as u64).into());
        merge_strings.push(format!("{a} {b}"));
    }
    let end_id = vocab.len();
    let byte_level = serde_json::json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true
    });
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{
            "id": end_id, "content": "<|end|>", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        }],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": vocab, "merges": merge_strings
        }
    })
    .to_string()
}

fn tiny_tokenizer() -> Tokenizer {
    Tokenizer::from_bytes(tiny_tokenizer_json().as_bytes()).unwrap()
}

/// Streams `ids` one at a time; checks that the chunks concatenate to `decode(ids)` and that
/// no chunk carries U+FFFD when the full text has none. Returns the chunks.
fn check_stream(tokenizer: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> Vec<String> {
    let mut stream: TextStream = tokenizer.stream(skip_special_tokens);
    let mut chunks: Vec<String> = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
    chunks.push(stream.finish().unwrap());
    let expected = tokenizer.decode(ids, skip_special_tokens).unwrap();
    assert_eq!(chunks.concat(), expected, "chunks {chunks:?}");
    if !expected.contains('\u{FFFD}') {
        assert!(chunks.iter().all(|c| !c.contains('\u{FFFD}')), "a chunk splits a character: {chunks:?}");
    }
    chunks
}

// ------------------------------------------------------------------------------------------
// Tokenizer
// ------------------------------------------------------------------------------------------

#[test]
fn types_are_send_and_sync() {
    fn check<T: Send + Sync + Clone>() {}
    check::<Tokenizer>();
    check::<TextStream>();
    check::<ChatTemplate>();
    check::<ChatOptions>();
    check::<TokenizerConfig>();
}

#[test]
fn tokenizer_encodes_and_decodes_byte_level_bpe() {
    let tok = tiny_tokenizer();
    assert_eq!(tok.vocab_size(true), 256 + 7 + 1);
    assert_eq!(tok.vocab_size(false), 256 + 7);
    let end = tok.token_to_id("<|end|>").unwrap();
    assert_eq!(tok.id_to_token(end).as_deref(), Some("<|end|>"));
    assert_eq!(tok.id_to_token(u32::from(b'h')).as_deref(), Some("h"));
    assert_eq!(tok.id_to_token(100_000), None);

    let text = "hello world 你好 😀<|end|>";
    let ids = tok.encode(text, true).unwrap();
    assert_eq!(ids[0], tok.token_to_id("hell").unwrap());
    assert!(ids.contains(&tok.token_to_id(&bytes_token(&[0xE4, 0xBD])).unwrap()));
    assert_eq!(*ids.last().unwrap(), end);
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert_eq!(tok.decode(&ids, true).unwrap(), "hello world 你好 😀");
    // Ids outside the vocabulary are dropped, as `tokenizers` does.
    assert_eq!(tok.decode(&[u32::from(b'a'), 5000, u32::from(b'b')], false).unwrap(), "ab");
    assert!(format!("{tok:?}").contains("<bytes>"));
}

#[test]
fn tokenizer_load_errors_name_the_file() {
    let dir = TempDir::new("text", "tok-missing");
    let err = Tokenizer::from_folder(&dir.0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LoadFailed);
    assert!(err.message().contains(&dir.0.join("tokenizer.json").display().to_string()), "{err}");

    let bad = dir.write("tokenizer.json", "{\"model\": [1, 2");
    let err = Tokenizer::from_file(&bad).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LoadFailed);
    assert!(err.message().contains(&bad.display().to_string()), "{err}");

    let wrong = dir.write("tokenizer.json", "{\"version\": \"1.0\", \"model\": {\"type\": \"Nope\"}}");
    let err = Tokenizer::from_file(&wrong).unwrap_err();
    assert!(err.message().contains(&wrong.display().to_string()), "{err}");

    assert_eq!(Tokenizer::from_bytes(b"not json").unwrap_err().kind(), ErrorKind::LoadFailed);
}

// ------------------------------------------------------------------------------------------
// Streaming detokenization
// ------------------------------------------------------------------------------------------

#[test]
fn stream_never_splits_characters() {
    let tok = tiny_tokenizer();
    let text = "hello 你好, 世界! 😀😀 wörld 👨‍👩‍👧 🇯🇵 한국어 façade";
    let ids = tok.encode(text, false).unwrap();
    let chunks = check_stream(&tok, &ids, false);
    // Every byte of a non-ASCII character is its own token here (or two bytes are), so the
    // stream must have held text back.
    assert!(chunks.iter().filter(|c| c.is_empty()).count() > 10, "{chunks:?}");
    // 你 is [E4 BD][A0]: nothing after the first token, the character after the second.
    let ni = tok.encode("你", false).unwrap();
    assert_eq!(ni.len(), 2);
    let mut stream = tok.stream(false);
    assert_eq!(stream.push(ni[0]).unwrap(), "");
    assert_eq!(stream.push(ni[1]).unwrap(), "你");
    assert_eq!(stream.finish().unwrap(), "");
}

#[test]
fn stream_with_special_tokens_and_incomplete_end() {
    let tok = tiny_tokenizer();
    let ids = tok.encode("hello<|end|> 你<|end|>😀", false).unwrap();
    check_stream(&tok, &ids, false);
    let skipped = check_stream(&tok, &ids, true);
    assert_eq!(skipped.concat(), "hello 你😀");

    // A stream cut inside a character: finish() flushes what decode() writes (U+FFFD).
    let cut = tok.encode("ab😀", false).unwrap();
    let cut = &cut[..cut.len() - 1];
    let mut stream = tok.stream(false);
    let pushed: String = cut.iter().map(|&id| stream.push(id).unwrap()).collect();
    assert_eq!(pushed, "ab");
    assert_eq!(stream.finish().unwrap(), "\u{FFFD}");
    // finish() resets the stream for reuse.
    assert_eq!(stream.push(u32::from(b'x')).unwrap(), "x");
}

// ------------------------------------------------------------------------------------------
// Chat templates: rendering as transformers' jinja2 environment does
// ------------------------------------------------------------------------------------------

// The expected outputs below were rendered with jinja2 3.1.6 in transformers' environment
// (ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols), its
// tojson, raise_exception and strftime_now), with the same variables.

#[test]
fn template_whitespace_control_is_transformers() {
    let source = "{% for m in messages %}\n  {% if m.role == 'user' %}\n    U: {{ m.content }}\n  {% else %}\n    A: {{ m.content }}\n  {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}\nA:\n{% endif %}\n";
    let t = ChatTemplate::from_str(source).unwrap();
    let text = t.render(&[Message::user("hi"), Message::assistant("yo")], true).unwrap();
    assert_eq!(text, "    U: hi\n    A: yo\nA:\n");
    assert_eq!(t.source(), source);
    assert_eq!(t.origin(), "<string>");
}

#[test]
fn template_tojson_is_python_json_dumps() {
    let source = r#"{{ tools | tojson }}
{{ tools[0] | tojson(indent=2) }}
{{ tools[0] | tojson(sort_keys=true) }}
{{ tools[0] | tojson(separators=(',', ':')) }}
{{ "é\"<>&'\n\t\u0001" | tojson }}
{{ "é😀" | tojson(ensure_ascii=true) }}
{{ [1.0, 0.1, 0.00001, 1e16, 123456789.125, -0.0, 3, -7, 1e-4, 2.5e-7, 1e15, 12345678901234567890.0, none, true, false, [], {}] | tojson }}
{{ {"a": [], "b": {}, "c": [1, {"d": none}]} | tojson(indent=1) }}
{{ {"a": 1} | tojson(indent="\t") }}"#;
    let tools = r#"[{"type": "function", "function": {"name": "f", "description": "d é", "parameters": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}}}]"#;
    let expected = "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d é\", \"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}}, \"required\": [\"x\"]}}}]\n{\n  \"type\": \"function\",\n  \"function\": {\n    \"name\": \"f\",\n    \"description\": \"d é\",\n    \"parameters\": {\n      \"type\": \"object\",\n      \"properties\": {\n        \"x\": {\n          \"type\": \"number\"\n        }\n      },\n      \"required\": [\n        \"x\"\n      ]\n    }\n  }\n}\n{\"function\": {\"description\": \"d é\", \"name\": \"f\", \"parameters\": {\"properties\": {\"x\": {\"type\": \"number\"}}, \"required\": [\"x\"], \"type\": \"object\"}}, \"type\": \"function\"}\n{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d é\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}},\"required\":[\"x\"]}}}\n\"é\\\"<>&'\\n\\t\\u0001\"\n\"\\u00e9\\ud83d\\ude00\"\n[1.0, 0.1, 1e-05, 1e+16, 123456789.125, -0.0, 3, -7, 0.0001, 2.5e-07, 1000000000000000.0, 1.2345678901234567e+19, null, true, false, [], {}]\n{\n \"a\": [],\n \"b\": {},\n \"c\": [\n  1,\n  {\n   \"d\": null\n  }\n ]\n}\n{\n\t\"a\": 1\n}";
    let t = ChatTemplate::from_str(source).unwrap();
    let options = ChatOptions::new().tools_json(tools).unwrap();
    assert_eq!(t.render_with(&[], &options).unwrap(), expected);

    // Tools from Rust structs keep their field order too.
    #[derive(serde::Serialize)]
    struct Tool {
        r#type: &'static str,
        name: &'static str,
    }
    let t = ChatTemplate::from_str("{{ tools | tojson }}").unwrap();
    let options = ChatOptions::new().tools(&[Tool { r#type: "function", name: "g" }]);
    assert_eq!(t.render_with(&[], &options).unwrap(), r#"[{"type": "function", "name": "g"}]"#);
}

#[test]
fn template_python_methods_tests_and_values() {
    let source = r#"{{ none }}|{{ true }}|{{ false }}|{{ tools }}|{{ documents }}
{{ '  a b  '.strip() }}|{{ 'x,y,z'.split(',') | join('+') }}|{{ ' a  b '.split() | join('+') }}|{{ 'hello'.startswith('he') }}|{{ 'hello'.endswith('lo') }}
{{ '\n\nx\n'.lstrip('\n') }}|{{ 'xx--'.rstrip('-') }}|{{ 'a-b'.replace('-', '+') }}|{{ 'abc'.upper() }}|{{ 'hello world'.title() }}
{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %}|{{ {'k': 1}.get('k') }}|{{ {'k': 1}.get('z', 'dflt') }}
{{ bos_token }}|{{ eos_token }}|{{ messages | length }}|{{ (messages | last).content }}|{{ messages[-1]['role'] }}
{% for m in messages[::-1] %}{{ m.role }}{% if not loop.last %},{% endif %}{% endfor %}|{% for m in messages %}{% if loop.index0 == 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}
{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content | length %}{% endfor %}{{ ns.n }}|{{ enable_thinking is defined }}|{{ enable_thinking }}|{{ messages[0].content is string }}|{{ messages[0] is mapping }}|{{ undefined_thing is defined }}
"#;
    let expected = "None|True|False|None|None\na b|x+y+z|a+b|True|True\nx\n|xx|a+b|ABC|Hello World\nb=1;a=2;|1|dflt\n<s>|</s>|2|there|assistant\nassistant,user|hi7|True|False|True|True|False";
    let t = ChatTemplate::from_str(source).unwrap();
    let options = ChatOptions::new()
        .kwarg("bos_token", "<s>")
        .kwargs_json(r#"{"eos_token": "</s>", "enable_thinking": false}"#)
        .unwrap();
    let messages = [Message::user("hi"), Message::assistant("there")];
    assert_eq!(t.render_with(&messages, &options).unwrap(), expected);
}

#[test]
fn template_extras_generation_tag_strftime_and_json_messages() {
    // transformers' {% generation %} marks assistant text for masks; it renders its body.
    let t = ChatTemplate::from_str(
        "{% for m in messages %}{% if m.role == 'assistant' %}{%- generation -%} [{{ m.content }}] {%- endgeneration -%}{% else %}{{ m.content }}{% endif %}{% endfor %}",
    )
    .unwrap();
    assert_eq!(t.render(&[Message::user("q"), Message::assistant("a")], false).unwrap(), "q[a]");

    let t = ChatTemplate::from_str("{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%d %b %Y') }}").unwrap();
    let text = t.render(&[], false).unwrap();
    let (iso, human) = text.split_once('|').unwrap();
    assert_eq!(iso.len(), 19, "{text}");
    let year: i32 = iso[..4].parse().unwrap();
    assert!(year >= 2025, "{text}");
    assert!(human.ends_with(&iso[..4]) && human.len() == 11, "{text}");

    // Messages with more than role and content, as JSON.
    let t = ChatTemplate::from_str(
        "{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls is defined %}{{ m.tool_calls | tojson }}{% endif %};{% endfor %}",
    )
    .unwrap();
    let messages = r#"[{"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": {"z": 1, "a": 2}}]}]"#;
    assert_eq!(
        t.render_json(messages, &ChatOptions::new()).unwrap(),
        r#"user:hi;assistant:[{"name": "f", "arguments": {"z": 1, "a": 2}}];"#
    );
    assert_eq!(t.render_json("{\"role\": 1}", &ChatOptions::new()).unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert!(ChatOptions::new().tools_json("{}").is_err());
    assert!(ChatOptions::new().kwargs_json("[1]").is_err());
    assert!(ChatOptions::new().kwargs_json("{oops").is_err());
}

#[test]
fn template_errors() {
    // A syntax error names the template and the line.
    let err =
        ChatTemplate::from_source("{% for m in messages %}\n{{ m.content }\n", "my/chat_template.jinja").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LoadFailed);
    assert!(err.message().contains("my/chat_template.jinja"), "{err}");
    assert!(err.message().contains("line 2"), "{err}");
    assert!(err.message().contains("syntax error"), "{err}");
    assert!(ChatTemplate::from_str("{% if x %}").is_err());

    // raise_exception ends rendering with the template's message.
    let t = ChatTemplate::from_source(
        "{% for m in messages %}\n{% if m.role == 'robot' %}\n{{ raise_exception('Unsupported role: ' ~ m.role) }}\n{% endif %}\n{% endfor %}",
        "robots.jinja",
    )
    .unwrap();
    assert_eq!(t.render(&[Message::user("hi")], false).unwrap(), "");
    let err = t.render(&[Message::user("hi"), Message::new("robot", "beep")], false).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("Unsupported role: robot"), "{err}");
    assert!(err.message().contains("robots.jinja"), "{err}");

    // Errors while rendering: unknown filter, attribute of undefined, tojson of undefined,
    // and a reserved extra argument.
    for source in ["{{ messages | nope }}", "{{ missing.attr }}", "{{ missing | tojson }}"] {
        let err = ChatTemplate::from_str(source).and_then(|t| t.render(&[], false)).unwrap_err();
        assert!(err.message().contains("<string>"), "{source}: {err}");
    }
    let t = ChatTemplate::from_str("{{ messages }}").unwrap();
    let err = t.render_with(&[], &ChatOptions::new().kwarg("messages", &1)).unwrap_err();
    assert!(err.message().contains("messages"), "{err}");
}

// ------------------------------------------------------------------------------------------
// Model folders: tokenizer_config.json, chat_template.jinja, stop ids
// ------------------------------------------------------------------------------------------

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

#[test]
fn folder_config_forms() {
    // Template string, tokens as strings, objects and null; unknown fields ignored.
    let dir = TempDir::new("text", "cfg-string");
    let config = serde_json::json!({
        "chat_template": "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token is defined }}|{{ messages[0].content }}",
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
        "eos_token": "</s>",
        "pad_token": null,
        "add_bos_token": true,
        "model_max_length": 512,
        "added_tokens_decoder": {"0": {"content": "<s>"}},
        "something_new": [1, 2, 3]
    });
    dir.write("tokenizer_config.json", &config.to_string());
    dir.write("special_tokens_map.json", r#"{"pad_token": {"content": "<pad>"}, "eos_token": "ignored"}"#);
    let cfg = TokenizerConfig::from_folder(&dir.0).unwrap();
    assert_eq!(cfg.bos_token.as_deref(), Some("<s>"));
    assert_eq!(cfg.eos_token.as_deref(), Some("</s>"));
    assert_eq!(cfg.pad_token.as_deref(), Some("<pad>")); // from special_tokens_map.json
    assert_eq!(cfg.unk_token, None);
    assert_eq!(cfg.add_bos_token, Some(true));
    assert_eq!(cfg.add_eos_token, None);
    assert_eq!(cfg.chat_templates.len(), 1);
    assert_eq!(cfg.chat_templates[0].name, "default");
    let t = ChatTemplate::from_folder(&dir.0).unwrap();
    assert!(t.origin().ends_with("tokenizer_config.json (chat_template)"), "{}", t.origin());
    assert_eq!(t.render(&[Message::user("x")], false).unwrap(), "<s>|</s>|<pad>|False|x");
    // Extra arguments override the folder's special tokens.
    let options = ChatOptions::new().kwarg("bos_token", "[B]");
    assert_eq!(t.render_with(&[Message::user("x")], &options).unwrap(), "[B]|</s>|<pad>|False|x");

    // chat_template.jinja replaces the config's default template.
    dir.write("chat_template.jinja", CHATML);
    let t = ChatTemplate::from_folder(&dir.0).unwrap();
    assert!(t.origin().ends_with("chat_template.jinja"));
    assert_eq!(
        t.render(&[Message::user("hi")], true).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    // additional_chat_templates/<name>.jinja adds named templates.
    dir.write("additional_chat_templates/tool_use.jinja", "tools: {{ tools | length }}");
    let t = ChatTemplate::from_folder_named(&dir.0, "tool_use").unwrap();
    let options = ChatOptions::new().tools_json("[{}, {}]").unwrap();
    assert_eq!(t.render_with(&[], &options).unwrap(), "tools: 2");
}

#[test]
fn folder_named_templates() {
    let dir = TempDir::new("text", "cfg-list");
    let config = serde_json::json!({
        "chat_template": [
            {"name": "tool_use", "template": "T{{ messages | length }}"},
            {"name": "default", "template": "D{{ messages | length }}"}
        ],
        "eos_token": "<|end|>"
    });
    dir.write("tokenizer_config.json", &config.to_string());
    let cfg = TokenizerConfig::from_folder(&dir.0).unwrap();
    let names: Vec<&str> = cfg.chat_templates.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["default", "tool_use"]);
    let messages = [Message::user("a"), Message::assistant("b")];
    assert_eq!(ChatTemplate::from_folder(&dir.0).unwrap().render(&messages, false).unwrap(), "D2");
    let tool_use = ChatTemplate::from_config(&cfg, Some("tool_use")).unwrap();
    assert_eq!(tool_use.render(&messages, false).unwrap(), "T2");
    assert!(tool_use.origin().contains("(chat_template \"tool_use\")"), "{}", tool_use.origin());
    let err = ChatTemplate::from_folder_named(&dir.0, "rag").unwrap_err();
    assert!(err.message().contains("\"rag\"") && err.message().contains("default, tool_use"), "{err}");

    // Several templates and no "default": the name must be given.
    let dir = TempDir::new("text", "cfg-nodefault");
    dir.write(
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "a", "template": "A"}, {"name": "b", "template": "B"}]}"#,
    );
    let err = ChatTemplate::from_folder(&dir.0).unwrap_err();
    assert!(err.message().contains("pick one by name"), "{err}");
    assert_eq!(ChatTemplate::from_folder_named(&dir.0, "b").unwrap().render(&[], false).unwrap(), "B");
}

#[test]
fn folder_config_errors() {
    let dir = TempDir::new("text", "cfg-errors");
    // No template anywhere.
    let err = ChatTemplate::from_folder(&dir.0).unwrap_err();
    assert!(err.message().contains("no chat template"), "{err}");
    assert_eq!(TokenizerConfig::from_folder(&dir.0).unwrap().chat_templates.len(), 0);
    assert!(TokenizerConfig::from_file(dir.0.join("tokenizer_config.json")).is_err());

    let path = dir.write("tokenizer_config.json", "{\"chat_template\": \"x\",");
    let err = TokenizerConfig::from_folder(&dir.0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LoadFailed);
    assert!(err.message().contains(&path.display().to_string()), "{err}");

    for (json, what) in [
        (r#"{"chat_template": 3}"#, "chat_template"),
        (r#"{"chat_template": [{"name": "x"}]}"#, "chat_template"),
        (r#"{"eos_token": 3}"#, "eos_token"),
        (r#"{"bos_token": {"text": "<s>"}}"#, "bos_token"),
        (r#"{"add_bos_token": "yes"}"#, "add_bos_token"),
        ("[]", "not a JSON object"),
    ] {
        dir.write("tokenizer_config.json", json);
        let err = TokenizerConfig::from_folder(&dir.0).unwrap_err();
        assert!(err.message().contains(what) && err.message().contains("tokenizer_config.json"), "{json}: {err}");
    }

    // A template with a syntax error names its file.
    dir.write("tokenizer_config.json", "{}");
    let jinja = dir.write("chat_template.jinja", "{% for m in messages %}{{ m.content }}");
    let err = ChatTemplate::from_folder(&dir.0).unwrap_err();
    assert!(err.message().contains(&jinja.display().to_string()), "{err}");
}

#[test]
fn folder_stop_ids() {
    let dir = TempDir::new("text", "stop");
    assert_eq!(stop_token_ids(&dir.0).unwrap(), Vec::<u32>::new());
    dir.write("tokenizer.json", &tiny_tokenizer_json());
    let end = tiny_tokenizer().token_to_id("<|end|>").unwrap();

    // config.json's eos when there is no generation_config.json.
    dir.write("config.json", r#"{"eos_token_id": 7, "hidden_size": 8}"#);
    assert_eq!(stop_token_ids(&dir.0).unwrap(), [7]);
    dir.write("generation_config.json", r#"{"eos_token_id": [5, 7, 5], "do_sample": true}"#);
    assert_eq!(stop_token_ids(&dir.0).unwrap(), [5, 7]);
    dir.write("tokenizer_config.json", r#"{"eos_token": {"content": "<|end|>"}}"#);
    assert_eq!(stop_token_ids(&dir.0).unwrap(), [5, 7, end]);
    dir.write("generation_config.json", &format!("{{\"eos_token_id\": {end}}}"));
    assert_eq!(stop_token_ids(&dir.0).unwrap(), [end]);
    dir.write("generation_config.json", r#"{"eos_token_id": null}"#);
    assert_eq!(stop_token_ids(&dir.0).unwrap(), [end]);

    dir.write("generation_config.json", r#"{"eos_token_id": "two"}"#);
    let err = stop_token_ids(&dir.0).unwrap_err();
    assert!(err.message().contains("generation_config.json"), "{err}");
    dir.write("generation_config.json", r#"{"eos_token_id": [1, -2]}"#);
    assert!(stop_token_ids(&dir.0).is_err());
    dir.write("generation_config.json", "{}");
    dir.write("tokenizer_config.json", r#"{"eos_token": "<|nowhere|>"}"#);
    let err = stop_token_ids(&dir.0).unwrap_err();
    assert!(err.message().contains("<|nowhere|>"), "{err}");
}

// ------------------------------------------------------------------------------------------
// Qwen2 fixtures: compare with transformers (tests/models/qwen2/reference.json)
// ------------------------------------------------------------------------------------------

const FOLDERS: [&str; 3] = ["tiny-tied", "tiny-untied", "tiny-sharded"];

/// The committed Qwen2 fixture folder; panics naming what is missing (the fixtures are part
/// of the repository, so a missing file is a broken checkout, not a case to skip).
fn fixtures() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/models/qwen2");
    let mut missing: Vec<String> = Vec::new();
    if !dir.join("reference.json").is_file() {
        missing.push("reference.json".into());
    }
    for folder in FOLDERS {
        for file in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
            if !dir.join(folder).join(file).is_file() {
                missing.push(format!("{folder}/{file}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the Qwen2 fixtures are missing from {}: {} (they are committed; restore them with git, \
         or regenerate them with tests/models/qwen2/make_fixtures.py)",
        dir.display(),
        missing.join(", ")
    );
    dir
}

#[derive(Deserialize)]
struct Reference {
    versions: Versions,
    tokenizer: TokenizerReference,
    chats: Vec<Chat>,
}

#[derive(Deserialize)]
struct Versions {
    special_tokens: std::collections::BTreeMap<String, u32>,
    tokenizer_len: usize,
}

#[derive(Deserialize)]
struct TokenizerReference {
    encode: Vec<EncodeCase>,
    decode: Vec<DecodeCase>,
}

#[derive(Deserialize)]
struct EncodeCase {
    text: String,
    ids: Vec<u32>,
    decoded: String,
}

#[derive(Deserialize)]
struct DecodeCase {
    ids: Vec<u32>,
    skip_special_tokens: bool,
    text: String,
}

/// Messages and tools are read as MiniJinja values (our dependency) so that their key order
/// is the file's: it shows in `tojson`.
#[derive(Deserialize)]
struct Chat {
    template: String,
    note: String,
    messages: minijinja::Value,
    add_generation_prompt: bool,
    tools: Option<minijinja::Value>,
    text: Option<String>,
    ids: Option<Vec<u32>>,
    error: Option<ChatError>,
}

#[derive(Deserialize)]
struct ChatError {
    message: String,
}

fn reference(dir: &Path) -> Reference {
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn qwen2_tokenizer_matches_transformers() {
    let dir = fixtures();
    let reference = reference(&dir);
    assert!(reference.tokenizer.encode.len() >= 10);
    for folder in FOLDERS {
        let tok = Tokenizer::from_folder(dir.join(folder)).unwrap();
        assert_eq!(tok.vocab_size(true), reference.versions.tokenizer_len, "{folder}");
        for (token, &id) in &reference.versions.special_tokens {
            assert_eq!(tok.token_to_id(token), Some(id), "{folder}: {token}");
            assert_eq!(tok.id_to_token(id).as_deref(), Some(token.as_str()), "{folder}");
        }
        for case in &reference.tokenizer.encode {
            let ids = tok.encode(&case.text, false).unwrap();
            assert_eq!(ids, case.ids, "{folder}: encode {:?}", case.text);
            assert_eq!(tok.decode(&ids, false).unwrap(), case.decoded, "{folder}: decode {:?}", case.text);
            check_stream(&tok, &ids, false);
            check_stream(&tok, &ids, true);
        }
        for case in &reference.tokenizer.decode {
            let text = tok.decode(&case.ids, case.skip_special_tokens).unwrap();
            assert_eq!(text, case.text, "{folder}: decode {:?}", case.ids);
        }
    }
}

#[test]
fn qwen2_chats_match_transformers() {
    let dir = fixtures();
    let reference = reference(&dir);
    let tok = Tokenizer::from_folder(dir.join("tiny-sharded")).unwrap();
    let mut rendered = 0;
    for chat in &reference.chats {
        // The default template is in each folder (a string in tokenizer_config.json,
        // chat_template.jinja, a named list); the others only in tiny-sharded.
        let templates: Vec<ChatTemplate> = if chat.template == "default" {
            FOLDERS.iter().map(|f| ChatTemplate::from_folder(dir.join(f)).unwrap()).collect()
        } else {
            vec![ChatTemplate::from_folder_named(dir.join("tiny-sharded"), &chat.template).unwrap()]
        };
        let messages = serde_json::to_string(&chat.messages).unwrap();
        let mut options = ChatOptions::new().add_generation_prompt(chat.add_generation_prompt);
        if let Some(tools) = &chat.tools {
            options = options.tools(tools);
        }
        for template in &templates {
            let result = template.render_json(&messages, &options);
            match (&chat.error, &chat.text) {
                (Some(error), _) => {
                    let err = result.unwrap_err();
                    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
                    assert!(err.message().contains(&error.message), "{}: {err}", chat.note);
                }
                (None, Some(text)) => {
                    let got = result.unwrap_or_else(|e| panic!("{} ({}): {e}", chat.note, template.origin()));
                    assert_eq!(&got, text, "{} ({})", chat.note, template.origin());
                    let ids = tok.encode(&got, false).unwrap();
                    assert_eq!(Some(&ids), chat.ids.as_ref(), "{}", chat.note);
                    rendered += 1;
                }
                (None, None) => panic!("chat {:?} has neither text nor error", chat.note),
            }
        }
    }
    assert!(rendered >= 10, "{rendered}");
    assert!(reference.chats.iter().any(|c| c.error.is_some()));
    assert!(reference.chats.iter().any(|c| c.tools.is_some()));
}

#[test]
fn qwen2_folders_stop_ids_and_config() {
    let dir = fixtures();
    let reference = reference(&dir);
    let im_end = reference.versions.special_tokens["<|im_end|>"];
    let end_of_text = reference.versions.special_tokens["<|endoftext|>"];
    // generation_config.json: [im_end, endoftext] for tiny-tied and tiny-sharded, im_end for
    // tiny-untied; the tokenizer's eos is im_end.
    assert_eq!(stop_token_ids(dir.join("tiny-tied")).unwrap(), [im_end, end_of_text]);
    assert_eq!(stop_token_ids(dir.join("tiny-untied")).unwrap(), [im_end]);
    assert_eq!(stop_token_ids(dir.join("tiny-sharded")).unwrap(), [im_end, end_of_text]);
    for folder in FOLDERS {
        let cfg = TokenizerConfig::from_folder(dir.join(folder)).unwrap();
        assert_eq!(cfg.eos_token.as_deref(), Some("<|im_end|>"), "{folder}");
        assert_eq!(cfg.bos_token, None, "{folder}");
        assert_eq!(cfg.add_bos_token, Some(false), "{folder}");
    }
    let err = ChatTemplate::from_folder_named(dir.join("tiny-untied"), "tool_use").unwrap_err();
    assert!(err.message().contains("default"), "{err}");
}

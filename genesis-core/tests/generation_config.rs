//! `GenerationConfig::from_folder` (a model folder's `generation_config.json`, with
//! transformers' defaults and fallbacks) and `find_stop_string`. Each case writes its files
//! into a fresh temporary folder that is removed afterwards.

mod common;

use common::TempDir;
use genesis::generation::{find_stop_string, GenerationConfig};

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

/// A fresh folder holding `generation_config.json` with `contents`.
fn with_generation_config(tag: &str, contents: &str) -> TempDir {
    let dir = TempDir::new("genconfig", tag);
    dir.write("generation_config.json", contents);
    dir
}

/// `from_folder` on a folder with this `generation_config.json`.
fn load(tag: &str, contents: &str) -> genesis::Result<GenerationConfig> {
    let dir = with_generation_config(tag, contents);
    GenerationConfig::from_folder(dir.path())
}

/// `from_folder` on a folder with this `generation_config.json` must fail, with an error that
/// names the file and mentions each of `words`.
fn load_err(tag: &str, contents: &str, words: &[&str]) {
    let dir = with_generation_config(tag, contents);
    let err = match GenerationConfig::from_folder(dir.path()) {
        Ok(config) => panic!("{contents}: loaded as {config:?}, expected an error"),
        Err(e) => e,
    };
    let message = err.to_string();
    let file = dir.path().join("generation_config.json").display().to_string();
    assert!(message.contains(&file), "{contents}: the error does not name {file}: {message}");
    for word in words {
        assert!(message.contains(word), "{contents}: the error does not mention {word:?}: {message}");
    }
}

// ------------------------------------------------------------------------------------------
// from_folder
// ------------------------------------------------------------------------------------------

#[test]
fn missing_file_gives_the_defaults() {
    let dir = TempDir::new("genconfig", "missing");
    let config = GenerationConfig::from_folder(dir.path()).unwrap();
    assert_eq!(config, GenerationConfig::default());
    assert!(!config.do_sample);
    assert_eq!(config.temperature, 1.0);
    assert_eq!(config.top_k, 50);
    assert_eq!(config.top_p, 1.0);
    assert_eq!(config.min_p, 0.0);
    assert_eq!(config.repetition_penalty, 1.0);
    assert_eq!(config.max_new_tokens, 256);
    assert!(config.eos_token_ids.is_empty());
    assert_eq!(config.pad_token_id, None);
    config.validate().unwrap();
}

#[test]
fn empty_object_gives_the_defaults() {
    assert_eq!(load("empty", "{}").unwrap(), GenerationConfig::default());
}

#[test]
fn eos_token_id_as_an_int() {
    let config = load("eos-int", r#"{"eos_token_id": 151645}"#).unwrap();
    assert_eq!(config.eos_token_ids, [151645]);
}

#[test]
fn eos_token_id_as_a_list() {
    let config = load("eos-list", r#"{"eos_token_id": [151645, 151643]}"#).unwrap();
    assert_eq!(config.eos_token_ids, [151645, 151643]);
    let config = load("eos-empty-list", r#"{"eos_token_id": []}"#).unwrap();
    assert!(config.eos_token_ids.is_empty());
    let config = load("eos-null", r#"{"eos_token_id": null}"#).unwrap();
    assert!(config.eos_token_ids.is_empty());
}

#[test]
fn bad_eos_token_id_is_an_error_naming_the_file() {
    load_err("eos-string", r#"{"eos_token_id": "<|im_end|>"}"#, &["eos_token_id"]);
    load_err("eos-negative", r#"{"eos_token_id": [1, -2]}"#, &["eos_token_id"]);
}

#[test]
fn sampling_fields_are_read() {
    let config = load(
        "sampling",
        r#"{
            "do_sample": true,
            "temperature": 0.7,
            "top_k": 20,
            "top_p": 0.8,
            "min_p": 0.05,
            "repetition_penalty": 1.05,
            "max_new_tokens": 512,
            "pad_token_id": 151643,
            "eos_token_id": [151645, 151643],
            "bos_token_id": 151643,
            "transformers_version": "4.45.0"
        }"#,
    )
    .unwrap();
    let expected = GenerationConfig {
        do_sample: true,
        temperature: 0.7,
        top_k: 20,
        top_p: 0.8,
        min_p: 0.05,
        repetition_penalty: 1.05,
        max_new_tokens: 512,
        pad_token_id: Some(151643),
        eos_token_ids: vec![151645, 151643],
        ..GenerationConfig::default()
    };
    assert_eq!(config, expected);
}

#[test]
fn fields_left_out_keep_their_defaults() {
    let config = load("partial", r#"{"temperature": 0.6, "max_new_tokens": 32}"#).unwrap();
    let expected = GenerationConfig { temperature: 0.6, max_new_tokens: 32, ..GenerationConfig::default() };
    assert_eq!(config, expected);
    // JSON integers are fine where a float is expected.
    let config = load("int-temperature", r#"{"do_sample": true, "temperature": 2}"#).unwrap();
    assert_eq!(config.temperature, 2.0);
}

#[test]
fn malformed_json_is_an_error_naming_the_file() {
    load_err("malformed", r#"{"do_sample": true, "temperature": 0.7"#, &[]);
    load_err("garbage", "not json at all", &[]);
    load_err("not-an-object", "[1, 2, 3]", &[]);
}

#[test]
fn non_numeric_temperature_is_an_error_naming_the_file() {
    load_err("temperature-string", r#"{"do_sample": true, "temperature": "hot"}"#, &["temperature"]);
    load_err("temperature-bool", r#"{"temperature": true}"#, &["temperature"]);
    load_err("top-p-string", r#"{"do_sample": true, "top_p": "0.9"}"#, &["top_p"]);
    load_err("do-sample-string", r#"{"do_sample": "yes"}"#, &["do_sample"]);
}

#[test]
fn top_p_out_of_range_while_sampling_is_an_error() {
    for top_p in ["0", "0.0", "1.5", "-0.5"] {
        let json = format!(r#"{{"do_sample": true, "top_p": {top_p}}}"#);
        load_err("top-p-range", &json, &["top_p"]);
    }
    // The edges that are allowed.
    assert_eq!(load("top-p-one", r#"{"do_sample": true, "top_p": 1.0}"#).unwrap().top_p, 1.0);
    assert_eq!(load("top-p-small", r#"{"do_sample": true, "top_p": 1e-6}"#).unwrap().top_p, 1e-6);
}

#[test]
fn sampling_settings_are_checked_only_when_sampling() {
    // Greedy decoding ignores temperature / top_p / min_p, as transformers does: a config that
    // sets them to values a sampler would reject still loads.
    let config = load("greedy-t0", r#"{"do_sample": false, "temperature": 0.0}"#).unwrap();
    assert!(!config.do_sample);
    config.validate().unwrap();
    let config = load("greedy-odd", r#"{"do_sample": false, "temperature": 0.0, "top_p": 0.0, "min_p": 1.5}"#).unwrap();
    assert!(!config.do_sample);
    config.validate().unwrap();
    // do_sample defaults to false.
    load("default-greedy", r#"{"temperature": 0.0, "top_p": 1.5}"#).unwrap();

    // The same values while sampling are errors naming the file.
    load_err("sample-t0", r#"{"do_sample": true, "temperature": 0.0}"#, &["temperature"]);
    load_err("sample-t-neg", r#"{"do_sample": true, "temperature": -1.0}"#, &["temperature"]);
    load_err("sample-min-p", r#"{"do_sample": true, "min_p": 1.5}"#, &["min_p"]);
    load_err("sample-min-p-neg", r#"{"do_sample": true, "min_p": -0.1}"#, &["min_p"]);
}

#[test]
fn validate_checks_sampling_settings_only_when_sampling() {
    let greedy = GenerationConfig { do_sample: false, temperature: 0.0, top_p: 0.0, min_p: 2.0, ..Default::default() };
    greedy.validate().unwrap();
    let sampling = GenerationConfig { do_sample: true, ..Default::default() };
    sampling.validate().unwrap();
    for (bad, what) in [
        (GenerationConfig { temperature: 0.0, ..sampling.clone() }, "temperature"),
        (GenerationConfig { temperature: f64::NAN, ..sampling.clone() }, "temperature"),
        (GenerationConfig { temperature: f64::INFINITY, ..sampling.clone() }, "temperature"),
        (GenerationConfig { top_p: 0.0, ..sampling.clone() }, "top_p"),
        (GenerationConfig { top_p: 1.5, ..sampling.clone() }, "top_p"),
        (GenerationConfig { top_p: f64::NAN, ..sampling.clone() }, "top_p"),
        (GenerationConfig { min_p: -0.1, ..sampling.clone() }, "min_p"),
        (GenerationConfig { min_p: 1.1, ..sampling.clone() }, "min_p"),
    ] {
        let err = bad.validate().unwrap_err();
        assert!(err.to_string().contains(what), "{bad:?}: {err}");
    }
}

#[test]
fn repetition_penalty_must_be_positive() {
    // The penalty applies to greedy decoding too, so it is checked either way.
    for do_sample in [false, true] {
        for penalty in ["0.0", "-1.0"] {
            let json = format!(r#"{{"do_sample": {do_sample}, "repetition_penalty": {penalty}}}"#);
            load_err("penalty", &json, &["repetition_penalty"]);
        }
    }
}

#[test]
fn eos_token_id_falls_back_to_config_json() {
    // No generation_config.json: transformers takes eos_token_id from the model's config.json.
    let dir = TempDir::new("genconfig", "fallback-int");
    dir.write("config.json", r#"{"model_type": "qwen2", "eos_token_id": 151643, "bos_token_id": 151643}"#);
    let config = GenerationConfig::from_folder(dir.path()).unwrap();
    assert_eq!(config.eos_token_ids, [151643]);

    let dir = TempDir::new("genconfig", "fallback-list");
    dir.write("config.json", r#"{"model_type": "qwen2", "eos_token_id": [151645, 151643], "pad_token_id": 7}"#);
    let config = GenerationConfig::from_folder(dir.path()).unwrap();
    assert_eq!(config.eos_token_ids, [151645, 151643]);
    assert_eq!(config.pad_token_id, Some(7));
    // Only the ids come from config.json; the sampling settings keep their defaults.
    assert_eq!(
        config,
        GenerationConfig { eos_token_ids: vec![151645, 151643], pad_token_id: Some(7), ..GenerationConfig::default() }
    );

    // A config.json without one leaves the list empty.
    let dir = TempDir::new("genconfig", "fallback-none");
    dir.write("config.json", r#"{"model_type": "qwen2"}"#);
    let config = GenerationConfig::from_folder(dir.path()).unwrap();
    assert!(config.eos_token_ids.is_empty());
}

#[test]
fn malformed_config_json_fallback_is_an_error_naming_it() {
    let dir = TempDir::new("genconfig", "fallback-bad");
    let path = dir.write("config.json", r#"{"eos_token_id": "</s>"}"#);
    let err = GenerationConfig::from_folder(dir.path()).unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()) && err.contains("eos_token_id"), "{err}");
    let path = dir.write("config.json", "{");
    let err = GenerationConfig::from_folder(dir.path()).unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
}

#[test]
fn generation_config_json_wins_over_config_json() {
    let dir = TempDir::new("genconfig", "both");
    dir.write("config.json", r#"{"model_type": "qwen2", "eos_token_id": 151643}"#);
    dir.write("generation_config.json", r#"{"eos_token_id": [151645, 151643]}"#);
    let config = GenerationConfig::from_folder(dir.path()).unwrap();
    assert_eq!(config.eos_token_ids, [151645, 151643]);
}

// ------------------------------------------------------------------------------------------
// find_stop_string
// ------------------------------------------------------------------------------------------

fn stops(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn stop_string_earliest_match_wins() {
    let text = "Answer: 42\nUser: next\n###";
    // Listed order does not matter; the match that starts first does.
    assert_eq!(find_stop_string(text, &stops(&["###", "User:", "\n"])), Some(10));
    assert_eq!(find_stop_string(text, &stops(&["###", "User:"])), Some(11));
    assert_eq!(find_stop_string(text, &stops(&["###"])), Some(text.len() - 3));
    // Matches that start at the same place: that place.
    assert_eq!(find_stop_string("abcdef", &stops(&["cde", "cd", "c"])), Some(2));
    // Overlapping stop strings: the one that starts first.
    assert_eq!(find_stop_string("xabcx", &stops(&["bc", "abc"])), Some(1));
    // A stop string at the very start.
    assert_eq!(find_stop_string("<|end|>tail", &stops(&["tail", "<|end|>"])), Some(0));
    // The first occurrence of a string that occurs twice.
    assert_eq!(find_stop_string("a--b--c", &stops(&["--"])), Some(1));
}

#[test]
fn stop_string_none() {
    assert_eq!(find_stop_string("hello world", &stops(&["bye", "World"])), None);
    assert_eq!(find_stop_string("hello world", &[]), None);
    assert_eq!(find_stop_string("", &stops(&["x"])), None);
    // A stop string longer than the text.
    assert_eq!(find_stop_string("ab", &stops(&["abc"])), None);
}

#[test]
fn empty_stop_strings_are_ignored() {
    assert_eq!(find_stop_string("hello", &stops(&[""])), None);
    assert_eq!(find_stop_string("", &stops(&[""])), None);
    assert_eq!(find_stop_string("hello", &stops(&["", "llo", ""])), Some(2));
    assert_eq!(find_stop_string("hello", &stops(&["", "zz"])), None);
}

#[test]
fn stop_string_in_multi_byte_text() {
    // The position is a byte offset on a char boundary, where the caller cuts the text.
    let text = "日本語です。END";
    let at = find_stop_string(text, &stops(&["END", "。"])).unwrap();
    assert_eq!(at, "日本語です".len());
    assert!(text.is_char_boundary(at));
    assert_eq!(&text[..at], "日本語です");

    let text = "héllo 😀 wörld";
    let at = find_stop_string(text, &stops(&["wörld", "😀"])).unwrap();
    assert_eq!(&text[..at], "héllo ");
    assert_eq!(&text[at..], "😀 wörld");

    // A multi-byte stop string does not match inside another character's bytes.
    assert_eq!(find_stop_string("é", &stops(&["e"])), None);
    assert_eq!(find_stop_string("naïve", &stops(&["ï"])), Some(2));
}

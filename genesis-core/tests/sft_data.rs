//! `genesis::sft`: JSONL records, assistant-only loss masks with the committed tiny-tied
//! Qwen2 fixture (ChatML template like Qwen2.5's), truncation, padded and packed batches,
//! the block-diagonal mask and resumable batch order.
#![cfg(feature = "text")]

use genesis::sft::{
    block_diagonal_mask, pack_examples, packed_batch, pad_batch, parse_jsonl, read_jsonl, shift_labels, BadLineKind,
    BadLinePolicy, DataPosition, RecordFormat, SftBatches, SftBatchesState, SftEncoder, SftExample, SftRecord,
    IGNORE_INDEX,
};
use genesis::text::{ChatTemplate, Message, Tokenizer};
use genesis::{DType, Device, ErrorKind, Tensor};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/models/qwen2/tiny-tied");
const DEFAULT_SYSTEM: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";

fn encoder() -> SftEncoder {
    SftEncoder::from_folder(FIXTURE).expect("tiny-tied fixture")
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_folder(FIXTURE).expect("tiny-tied tokenizer")
}

/// The texts of the maximal runs of labelled tokens, decoded with special tokens kept.
fn labelled_runs(example: &SftExample) -> Vec<String> {
    let tok = tokenizer();
    let mut runs = Vec::new();
    let mut current = Vec::new();
    for (&id, &label) in example.input_ids.iter().zip(&example.labels) {
        if label == IGNORE_INDEX {
            if !current.is_empty() {
                runs.push(tok.decode(&current, false).unwrap());
                current.clear();
            }
        } else {
            assert_eq!(label, i64::from(id), "a label is its own token id");
            current.push(id);
        }
    }
    if !current.is_empty() {
        runs.push(tok.decode(&current, false).unwrap());
    }
    runs
}

fn record(json: &str) -> SftRecord {
    SftRecord::from_json_str(json).expect("valid record")
}

// ------------------------------------------------------------------------------------------
// Loss masks
// ------------------------------------------------------------------------------------------

#[test]
fn single_turn_mask_is_the_reply_and_im_end() {
    let enc = encoder();
    let r = record(
        r#"{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there!"}]}"#,
    );
    let (text, spans) = enc.render_with_spans(&r).unwrap();
    let expected =
        format!("{DEFAULT_SYSTEM}<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello there!<|im_end|>\n");
    assert_eq!(text, expected);
    assert_eq!(spans.len(), 1);
    assert_eq!(&text[spans[0].clone()], "Hello there!<|im_end|>\n");

    let ex = enc.encode(&r).unwrap();
    assert_eq!(ex.input_ids, tokenizer().encode(&expected, false).unwrap(), "the text is tokenized once, whole");
    assert_eq!(ex.labels.len(), ex.input_ids.len());
    assert_eq!(labelled_runs(&ex), vec!["Hello there!<|im_end|>\n".to_string()]);
    // The whole turn is trained on: <|im_end|>, then the line break that closes the turn.
    let im_end = i64::from(tokenizer().token_to_id("<|im_end|>").unwrap());
    let last_trained = ex.labels.iter().rposition(|&l| l != IGNORE_INDEX).unwrap();
    assert_eq!(last_trained, ex.len() - 1);
    assert_eq!(ex.labels[ex.len() - 2], im_end);
    // "<|im_start|>assistant\n" is not trained on.
    let prompt = format!("{DEFAULT_SYSTEM}<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    let prompt_len = tokenizer().encode(&prompt, false).unwrap().len();
    assert!(ex.labels[..prompt_len].iter().all(|&l| l == IGNORE_INDEX));
    assert!(ex.labels[prompt_len..=last_trained].iter().all(|&l| l != IGNORE_INDEX));
}

#[test]
fn multi_turn_with_system_trains_every_assistant_turn() {
    let enc = encoder();
    let r = SftRecord::conversation(vec![
        Message::system("Be brief."),
        Message::user("What is 2+2?"),
        Message::assistant("4."),
        Message::user("And 3 + 3?"),
        Message::assistant("  6, of course.\n"),
    ])
    .unwrap();
    let ex = enc.encode(&r).unwrap();
    // The template strips contents; the spans follow the rendered text.
    assert_eq!(labelled_runs(&ex), vec!["4.<|im_end|>\n".to_string(), "6, of course.<|im_end|>\n".to_string()]);
    let text = tokenizer().decode(&ex.input_ids, false).unwrap();
    assert!(text.starts_with("<|im_start|>system\nBe brief.<|im_end|>\n"), "{text}");
    assert!(!text.contains("helpful assistant"), "a given system message replaces the default");
}

#[test]
fn unicode_reply_is_masked_on_byte_offsets() {
    let enc = encoder();
    let r =
        SftRecord::conversation(vec![Message::user("Grüße?"), Message::assistant("Grüße zurück — 你好 😀")]).unwrap();
    let ex = enc.encode(&r).unwrap();
    assert_eq!(labelled_runs(&ex), vec!["Grüße zurück — 你好 😀<|im_end|>\n".to_string()]);
}

#[test]
fn prompt_completion_is_a_user_and_an_assistant_message() {
    let enc = encoder();
    let pc = record(r#"{"prompt": "Name a colour.", "completion": "Blue."}"#);
    assert_eq!(pc.format, RecordFormat::PromptCompletion);
    assert_eq!(pc.messages, vec![Message::user("Name a colour."), Message::assistant("Blue.")]);
    let conv = SftRecord::conversation(pc.messages.clone()).unwrap();
    assert_eq!(enc.encode(&pc).unwrap(), enc.encode(&conv).unwrap());
    assert_eq!(labelled_runs(&enc.encode(&pc).unwrap()), vec!["Blue.<|im_end|>\n".to_string()]);
    assert_eq!(SftRecord::prompt_completion("Name a colour.", "Blue.").unwrap().messages, pc.messages);
}

#[test]
fn conversational_prompt_completion_trains_only_the_completion() {
    let enc = encoder();
    let r = record(
        r#"{"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"},
                      {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}],
            "completion": [{"role": "assistant", "content": "A2"}]}"#,
    );
    assert_eq!(r.format, RecordFormat::ConversationalPromptCompletion);
    assert_eq!(r.first_trained, 4);
    assert_eq!(labelled_runs(&enc.encode(&r).unwrap()), vec!["A2<|im_end|>\n".to_string()]);
    // As a conversation, both assistant turns are trained on.
    let conv = SftRecord::conversation(r.messages.clone()).unwrap();
    assert_eq!(
        labelled_runs(&enc.encode(&conv).unwrap()),
        vec!["A1<|im_end|>\n".to_string(), "A2<|im_end|>\n".to_string()]
    );
}

#[test]
fn shifted_targets_are_the_next_labels() {
    let ex = SftExample { input_ids: vec![5, 6, 7, 8], labels: vec![IGNORE_INDEX, IGNORE_INDEX, 7, 8] };
    assert_eq!(ex.shifted_targets(), vec![IGNORE_INDEX, 7, 8, IGNORE_INDEX]);
    assert_eq!(ex.target_count(), 2);
    assert_eq!(shift_labels(&[]), Vec::<i64>::new());
}

#[test]
fn a_template_that_is_not_prefix_stable_is_an_error_naming_it() {
    // Appends the message count, so a shorter conversation is not a prefix of a longer one.
    let template = ChatTemplate::from_source(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}{{ messages|length }}",
        "counting.jinja",
    )
    .unwrap();
    let enc = SftEncoder::new(tokenizer(), template);
    let r = SftRecord::conversation(vec![Message::user("a"), Message::assistant("b")]).unwrap();
    let err = enc.encode(&r).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("counting.jinja") && err.message().contains("not a prefix"), "{err}");
}

#[test]
fn a_role_the_template_rejects_fails_with_the_template_message_and_line() {
    let text =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n\
                {\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"tool\", \"content\": \"r\"}, \
                {\"role\": \"assistant\", \"content\": \"a\"}]}\n";
    let read = parse_jsonl(text, "tools.jsonl", BadLinePolicy::Stop).unwrap();
    assert_eq!(read.records.len(), 2, "tool is an accepted role");
    let err = encoder().encode_all(&read.records, 512).unwrap_err();
    assert!(err.message().contains("line 2") && err.message().contains("Unsupported role: tool"), "{err}");
}

// ------------------------------------------------------------------------------------------
// JSONL reading and bad input
// ------------------------------------------------------------------------------------------

const MIXED: &str = r#"{"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]}
{"messages": [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}
{"messages": [{"role": "user", "content": "q3"}, {"role": "bot", "content": "a3"}]}

{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q4"}]}
{"prompt": "p5", "completion": "c5"}
{"messages": [{"role": "user", "content": 7}, {"role": "assistant", "content": "a6"}]}
{"messages": [{"role": "user", "content": "q7"}, {"role": "assistant"}]}
"#;

#[test]
fn stop_policy_names_the_first_bad_line() {
    let err = parse_jsonl(MIXED, "mixed.jsonl", BadLinePolicy::Stop).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().starts_with("mixed.jsonl: line 2: malformed JSON"), "{err}");
}

#[test]
fn skip_policy_counts_bad_lines_with_reasons() {
    let read = parse_jsonl(MIXED, "mixed.jsonl", BadLinePolicy::Skip).unwrap();
    assert_eq!(read.records.len(), 2);
    assert_eq!(read.records[0].line, Some(1));
    assert_eq!(read.records[1].line, Some(6));
    assert_eq!(read.records[1].format, RecordFormat::PromptCompletion);
    assert_eq!(read.blank_lines, 1);
    let bad: Vec<(usize, BadLineKind)> = read.skipped.iter().map(|b| (b.line, b.kind)).collect();
    assert_eq!(
        bad,
        vec![
            (2, BadLineKind::MalformedJson),
            (3, BadLineKind::UnknownRole),
            (5, BadLineKind::NoAssistant),
            (7, BadLineKind::BadContent),
            (8, BadLineKind::BadContent),
        ]
    );
    assert!(read.skipped[1].reason.contains("\"bot\""), "{}", read.skipped[1].reason);
    assert!(read.skipped[3].reason.contains("content must be a string, got a number"), "{}", read.skipped[3].reason);
    assert!(read.skipped[4].reason.contains("no \"content\""), "{}", read.skipped[4].reason);
    let counts = read.skipped_by_kind();
    assert_eq!(counts[&BadLineKind::BadContent], 2);
    let summary = read.skipped_summary().unwrap();
    assert_eq!(
        summary,
        format!(
            "skipped 5 lines (1 malformed JSON, 1 unknown role, 2 bad content, 1 no assistant turn); first: {}",
            read.skipped[0]
        )
    );
}

#[test]
fn record_errors_say_what_is_wrong() {
    let cases = [
        (r#"[1, 2]"#, "expected a JSON object, got a list"),
        (r#"{"text": "hi"}"#, "needs \"messages\" or \"prompt\" and \"completion\"; keys are \"text\""),
        (r#"{"messages": "hi"}"#, "\"messages\" must be a list, got a string"),
        (r#"{"messages": []}"#, "no messages"),
        (r#"{"messages": [{"role": "user", "content": "q"}]}"#, "the conversation has no assistant message"),
        (r#"{"messages": [{"role": "assistant", "content": "a"}]}"#, "starts with an assistant message"),
        (r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}]}"#, "blank"),
        (r#"{"messages": [{"content": "q"}]}"#, "no \"role\""),
        (r#"{"messages": [{"role": "User", "content": "q"}]}"#, "unknown role \"User\""),
        (r#"{"prompt": "p"}"#, "has \"prompt\" but no \"completion\""),
        (r#"{"prompt": "p", "completion": [{"role": "assistant", "content": "c"}]}"#, "must both be strings"),
        (
            r#"{"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "user", "content": "c"}]}"#,
            "the completion has no assistant message",
        ),
        (r#"{"messages": [], "prompt": "p", "completion": "c"}"#, "has both"),
    ];
    for (json, expected) in cases {
        let err = SftRecord::from_json_str(json).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.message().contains(expected), "{json}: {err}");
    }
    assert!(SftRecord::conversation(vec![Message::user("q"), Message::new("robot", "a")]).is_err());
}

#[test]
fn read_jsonl_handles_bom_crlf_and_missing_files() {
    let dir = std::env::temp_dir().join(format!("genesis-sft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("train.jsonl");
    let text = "\u{feff}{\"prompt\": \"p\", \"completion\": \"c\"}\r\n\r\n{\"prompt\": \"p2\", \"completion\": \"c2\"}\r\nnot json\r\n";
    std::fs::write(&path, text).unwrap();
    let err = read_jsonl(&path, BadLinePolicy::Stop).unwrap_err();
    assert!(err.message().contains("train.jsonl: line 4: malformed JSON"), "{err}");
    let read = read_jsonl(&path, BadLinePolicy::Skip).unwrap();
    assert_eq!(read.records.iter().map(|r| r.line).collect::<Vec<_>>(), vec![Some(1), Some(3)]);
    assert_eq!(read.records[1].messages[1].content, "c2");
    std::fs::write(&path, b"{\"prompt\": \"p\", \"completion\": \"\xff\"}\n").unwrap();
    let read = read_jsonl(&path, BadLinePolicy::Skip).unwrap();
    assert_eq!(read.skipped[0].kind, BadLineKind::MalformedJson);
    assert!(read.skipped[0].reason.contains("UTF-8"));
    let _ = std::fs::remove_dir_all(&dir);
    let err = read_jsonl(dir.join("missing.jsonl"), BadLinePolicy::Skip).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LoadFailed);
    assert!(err.message().contains("missing.jsonl"), "{err}");
}

// ------------------------------------------------------------------------------------------
// Truncation
// ------------------------------------------------------------------------------------------

#[test]
fn truncation_keeps_the_start_and_counts() {
    let enc = encoder();
    let short = SftRecord::conversation(vec![Message::user("Hi"), Message::assistant("Yo")]).unwrap();
    let long_reply =
        SftRecord::conversation(vec![Message::user("Hi"), Message::assistant("word ".repeat(60))]).unwrap();
    let mut long_prompt =
        SftRecord::conversation(vec![Message::user("word ".repeat(60)), Message::assistant("ok")]).unwrap();
    long_prompt.line = Some(9);
    let full_short = enc.encode(&short).unwrap();
    let full_reply = enc.encode(&long_reply).unwrap();
    let max_len = full_short.len() + 5;
    assert!(full_reply.len() > max_len && enc.encode(&long_prompt).unwrap().len() > max_len);

    let records = [short, long_reply, long_prompt];
    let (examples, summary) = enc.encode_all(&records, max_len).unwrap();
    assert_eq!(summary.records, 3);
    assert_eq!(summary.examples, 2);
    assert_eq!(summary.truncated, 1);
    assert_eq!(summary.dropped, 1);
    assert_eq!(summary.dropped_records, vec![2]);
    assert_eq!(records[summary.dropped_records[0]].line, Some(9));
    assert_eq!(summary.longest, full_reply.len().max(enc.encode(&records[2]).unwrap().len()));
    assert_eq!(examples[0], full_short);
    assert_eq!(examples[1].input_ids, full_reply.input_ids[..max_len]);
    assert_eq!(examples[1].labels, full_reply.labels[..max_len]);
    assert!(examples[1].target_count() > 0);
    assert_eq!(summary.tokens, full_short.len() + max_len);
    assert_eq!(summary.target_tokens, examples[0].target_count() + examples[1].target_count());
    assert_eq!(enc.encode_all(&records, 1).unwrap_err().kind(), ErrorKind::InvalidArgument);
}

// ------------------------------------------------------------------------------------------
// Batches
// ------------------------------------------------------------------------------------------

fn ex(ids: &[u32], trained_from: usize) -> SftExample {
    let labels =
        ids.iter().enumerate().map(|(i, &id)| if i >= trained_from { i64::from(id) } else { IGNORE_INDEX }).collect();
    SftExample { input_ids: ids.to_vec(), labels }
}

#[test]
fn padded_batch_right_pads_with_a_mask() {
    let cpu = Device::cpu().unwrap();
    let examples = [ex(&[1, 2, 3], 1), ex(&[4, 5, 6, 7, 8], 3)];
    let batch = pad_batch(&examples, 0, &cpu).unwrap();
    assert_eq!(batch.input_ids.shape(), &[2, 5]);
    assert_eq!(batch.input_ids.dtype(), DType::I64);
    assert_eq!(batch.input_ids.to_vec::<i64>().unwrap(), vec![1, 2, 3, 0, 0, 4, 5, 6, 7, 8]);
    let x = IGNORE_INDEX;
    assert_eq!(batch.labels.to_vec::<i64>().unwrap(), vec![x, 2, 3, x, x, x, x, x, 7, 8]);
    assert_eq!(batch.targets.to_vec::<i64>().unwrap(), vec![2, 3, x, x, x, x, x, 7, 8, x]);
    assert_eq!(batch.attention_mask.to_vec::<i64>().unwrap(), vec![1, 1, 1, 0, 0, 1, 1, 1, 1, 1]);
    let refs: Vec<&SftExample> = examples.iter().collect();
    assert_eq!(pad_batch(&refs, 0, &cpu).unwrap().input_ids.to_vec::<i64>().unwrap().len(), 10);
    assert!(pad_batch::<SftExample>(&[], 0, &cpu).is_err());
    let bad = SftExample { input_ids: vec![1, 2], labels: vec![1] };
    assert!(pad_batch(&[bad], 0, &cpu).unwrap_err().message().contains("2 ids and 1 labels"));
}

#[test]
fn packing_restarts_positions_and_marks_segments() {
    let examples = [ex(&[1, 2, 3], 1), ex(&[4, 5, 6, 7], 2), ex(&[8, 9], 1), ex(&[10, 11, 12, 13, 14, 15], 0)];
    let rows = pack_examples(&examples, 8, 0).unwrap();
    assert_eq!(rows.len(), 2);
    let x = IGNORE_INDEX;
    assert_eq!(rows[0].input_ids, vec![1, 2, 3, 4, 5, 6, 7, 0]);
    assert_eq!(rows[0].labels, vec![x, 2, 3, x, x, 6, 7, x]);
    assert_eq!(rows[0].position_ids, vec![0, 1, 2, 0, 1, 2, 3, 0]);
    assert_eq!(rows[0].segment_ids, vec![1, 1, 1, 2, 2, 2, 2, 0]);
    assert_eq!(rows[0].examples(), 2);
    assert_eq!(rows[1].input_ids, vec![8, 9, 10, 11, 12, 13, 14, 15]);
    // The first token of every example is never a target, even when it is labelled alone.
    assert_eq!(rows[1].labels, vec![x, 9, x, 11, 12, 13, 14, 15]);
    assert_eq!(rows[1].position_ids, vec![0, 1, 0, 1, 2, 3, 4, 5]);
    assert_eq!(rows[1].segment_ids, vec![1, 1, 2, 2, 2, 2, 2, 2]);

    let cpu = Device::cpu().unwrap();
    let batch = packed_batch(&rows, &cpu).unwrap();
    assert_eq!(batch.input_ids.shape(), &[2, 8]);
    assert_eq!(batch.position_ids.to_vec::<i64>().unwrap()[..8], [0, 1, 2, 0, 1, 2, 3, 0]);
    assert_eq!(batch.targets.to_vec::<i64>().unwrap()[..8], [2, 3, x, x, 6, 7, x, x]);
    assert_eq!(batch.attention_mask.shape(), &[2, 1, 8, 8]);
    assert_eq!(batch.attention_mask.dtype(), DType::Bool);
    let mask = batch.attention_mask.to_vec::<bool>().unwrap();
    let segments = batch.segment_ids.to_vec::<i64>().unwrap();
    for b in 0..2 {
        for i in 0..8 {
            for j in 0..8 {
                let (si, sj) = (segments[b * 8 + i], segments[b * 8 + j]);
                let expected = (j <= i && si == sj && si != 0) || i == j;
                assert_eq!(mask[(b * 8 + i) * 8 + j], expected, "row {b}, query {i}, key {j}");
            }
        }
    }

    let err = pack_examples(&[ex(&[1; 9], 0)], 8, 0).unwrap_err();
    assert!(err.message().contains("9 tokens, more than max_len 8"), "{err}");
}

#[test]
fn block_diagonal_mask_by_hand() {
    let cpu = Device::cpu().unwrap();
    let segments = Tensor::from_vec(vec![1i64, 1, 2, 2, 2, 0], &[1, 6], &cpu).unwrap();
    let mask = block_diagonal_mask(&segments).unwrap();
    assert_eq!(mask.shape(), &[1, 1, 6, 6]);
    #[rustfmt::skip]
    let expected = [
        1, 0, 0, 0, 0, 0,
        1, 1, 0, 0, 0, 0,
        0, 0, 1, 0, 0, 0,
        0, 0, 1, 1, 0, 0,
        0, 0, 1, 1, 1, 0,
        0, 0, 0, 0, 0, 1,
    ];
    let got: Vec<i32> = mask.to_vec::<bool>().unwrap().into_iter().map(i32::from).collect();
    assert_eq!(got, expected);
    let flat = Tensor::from_vec(vec![1i64, 1], &[2], &cpu).unwrap();
    assert!(block_diagonal_mask(&flat).is_err());
}

#[test]
fn encoded_fixture_examples_pack_and_pad() {
    let enc = encoder();
    let records: Vec<SftRecord> = (0..4)
        .map(|i| SftRecord::prompt_completion(format!("Question {i}?"), format!("Answer {i}.")).unwrap())
        .collect();
    let (examples, _) = enc.encode_all(&records, 64).unwrap();
    let pad = tokenizer().token_to_id("<|endoftext|>").unwrap();
    let rows = pack_examples(&examples, 64, pad).unwrap();
    let packed: usize = rows.iter().map(|r| r.examples()).sum();
    assert_eq!(packed, 4);
    let trained: usize = rows.iter().map(|r| r.labels.iter().filter(|&&l| l != IGNORE_INDEX).count()).sum();
    assert_eq!(trained, examples.iter().map(SftExample::target_count).sum::<usize>());
    let batch = pad_batch(&examples, pad, &Device::cpu().unwrap()).unwrap();
    let longest = examples.iter().map(SftExample::len).max().unwrap();
    assert_eq!(batch.labels.shape(), &[4, longest]);
}

// ------------------------------------------------------------------------------------------
// Order and resuming
// ------------------------------------------------------------------------------------------

#[test]
fn epochs_are_seeded_permutations() {
    let batches = SftBatches::new((0..10).collect::<Vec<u32>>(), 3, 42).unwrap();
    assert_eq!(batches.batches_per_epoch(), 4);
    let (e0, e1) = (batches.epoch_order(0), batches.epoch_order(1));
    let mut sorted = e0.clone();
    sorted.sort();
    assert_eq!(sorted, (0..10).collect::<Vec<_>>());
    assert_ne!(e0, e1, "epochs differ");
    assert_ne!(e0, (0..10).collect::<Vec<_>>(), "shuffled");
    assert_eq!(SftBatches::new((0..10).collect::<Vec<u32>>(), 3, 42).unwrap().epoch_order(1), e1);
    assert_ne!(SftBatches::new((0..10).collect::<Vec<u32>>(), 3, 43).unwrap().epoch_order(0), e0);
    let plain = SftBatches::new((0..10).collect::<Vec<u32>>(), 3, 42).unwrap().shuffle(false);
    assert_eq!(plain.epoch_order(5), (0..10).collect::<Vec<_>>());

    // Batches walk the order, the last one smaller, then the next epoch starts.
    let mut it = batches.clone();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.extend(it.next_indices());
    }
    assert_eq!(seen, e0);
    assert_eq!(it.position(), DataPosition { epoch: 1, batch: 0 });
    assert_eq!(it.next_batch(), e1[..3].iter().map(|&i| &batches.items()[i]).collect::<Vec<_>>());

    let dropped = SftBatches::new((0..10).collect::<Vec<u32>>(), 3, 42).unwrap().drop_last(true).unwrap();
    assert_eq!(dropped.batches_per_epoch(), 3);
    assert!(SftBatches::new(vec![1, 2], 3, 0).unwrap().drop_last(true).is_err());
    assert!(SftBatches::new(Vec::<u32>::new(), 3, 0).is_err());
    assert!(SftBatches::new(vec![1], 0, 0).is_err());
}

#[test]
fn resume_from_a_saved_position_gives_the_same_batches() {
    let items: Vec<u32> = (0..7).collect();
    let mut run = SftBatches::new(items.clone(), 2, 9).unwrap();
    for _ in 0..6 {
        run.next_indices();
    }
    let saved = serde_json::to_string(&run.state_dict()).unwrap();
    let expected: Vec<Vec<usize>> = (0..9).map(|_| run.next_indices()).collect();

    let state: SftBatchesState = serde_json::from_str(&saved).unwrap();
    assert_eq!(state.position, DataPosition { epoch: 1, batch: 2 });
    let mut resumed = SftBatches::new(items.clone(), 2, 9).unwrap();
    resumed.load_state_dict(&state).unwrap();
    assert_eq!(resumed.position(), state.position);
    let got: Vec<Vec<usize>> = (0..9).map(|_| resumed.next_indices()).collect();
    assert_eq!(got, expected);

    let mut sought = SftBatches::new(items.clone(), 2, 9).unwrap();
    sought.seek(DataPosition { epoch: 1, batch: 2 }).unwrap();
    assert_eq!(sought.next_indices(), expected[0]);
    assert!(sought.seek(DataPosition { epoch: 0, batch: 4 }).is_err());

    let mut other = SftBatches::new(items[..6].to_vec(), 2, 10).unwrap();
    let err = other.load_state_dict(&state).unwrap_err();
    assert!(err.message().contains("seed 9 (saved) vs 10") && err.message().contains("items 7 (saved) vs 6"), "{err}");
}

//! The sub-document unit tests: paths, lookups (tree, text and fast path), mutations.

use super::*;
use serde_json::json;

fn key(k: &str) -> Component {
    Component::Key(k.to_owned())
}

#[test]
fn paths_parse_with_indices_escapes_and_limits() {
    assert_eq!(parse_path(b"").unwrap(), vec![]);
    assert_eq!(
        parse_path(b"a.b[0].c[-1]").unwrap(),
        vec![
            key("a"),
            key("b"),
            Component::Index(0),
            key("c"),
            Component::Index(-1)
        ]
    );
    assert_eq!(
        parse_path(b"`dot.ted`.x").unwrap(),
        vec![key("dot.ted"), key("x")]
    );
    assert_eq!(parse_path(b"`back``tick`").unwrap(), vec![key("back`tick")]);
    assert_eq!(
        parse_path(b"[2][0]").unwrap(),
        vec![Component::Index(2), Component::Index(0)]
    );
    assert_eq!(
        parse_path(b"a[2][3]").unwrap(),
        vec![key("a"), Component::Index(2), Component::Index(3)]
    );
    assert_eq!(
        parse_path(b"a.`b.c`[1]").unwrap(),
        vec![key("a"), key("b.c"), Component::Index(1)]
    );
    assert_eq!(parse_path(b"`a[1]`").unwrap(), vec![key("a[1]")]);
    // A dot before an index, as KV-Engine accepts it.
    assert_eq!(
        parse_path(b"array.[2]").unwrap(),
        vec![key("array"), Component::Index(2)]
    );
    assert_eq!(
        parse_path(b"a[0].[1].b").unwrap(),
        vec![key("a"), Component::Index(0), Component::Index(1), key("b")]
    );
    for bad in [
        &b"a..b"[..],
        b".a",
        b"a.",
        b"a[",
        b"a[x]",
        b"a[-2]",
        b"a]",
        b"`open",
        b".[0]",
        b"a..[0]",
    ] {
        assert_eq!(
            parse_path(bad),
            Err(SubdocError::PathInvalid),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    let deep = vec!["a"; MAX_DEPTH + 1].join(".");
    assert_eq!(parse_path(deep.as_bytes()), Err(SubdocError::PathTooBig));
    assert_eq!(
        parse_path(&[b'a'; MAX_PATH_LEN + 1]),
        Err(SubdocError::PathTooBig)
    );
}

/// A path's text for `components`: keys needing it in backticks (a literal backtick
/// doubled), indices in brackets, each after a dot when `dots` says so (`a.[2]`).
fn render(components: &[Component], dots: &[bool]) -> String {
    let mut out = String::new();
    for (i, c) in components.iter().enumerate() {
        match c {
            Component::Key(k) => {
                if i > 0 {
                    out.push('.');
                }
                if k.contains(['.', '[', ']', '`']) {
                    out.push('`');
                    out.push_str(&k.replace('`', "``"));
                    out.push('`');
                } else {
                    out.push_str(k);
                }
            }
            Component::Index(n) => {
                if i > 0 && dots.get(i).copied().unwrap_or(false) {
                    out.push('.');
                }
                out.push_str(&format!("[{n}]"));
            }
        }
    }
    out
}

mod path_forms {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every path the forms KV-Engine accepts can write parses back to its
        /// components: keys with any of `.[]` and backticks escaped, indices (the last,
        /// -1) after a key, an index, at the root, or after a dot.
        #[test]
        fn paths_in_every_accepted_form_parse_back(
            components in prop::collection::vec(
                prop_oneof![
                    "[a-z0-9 _.\\[\\]`$-]{1,6}".prop_map(Component::Key),
                    (-1i64..1000).prop_map(Component::Index),
                ],
                0..=MAX_DEPTH,
            ),
            dots in prop::collection::vec(any::<bool>(), MAX_DEPTH + 1),
        ) {
            let text = render(&components, &dots);
            prop_assume!(text.len() <= MAX_PATH_LEN);
            prop_assert_eq!(parse_path(text.as_bytes()), Ok(components), "{}", text);
        }
    }
}

fn doc() -> Value {
    json!({"name": "toy", "tags": ["a", "b"], "d": {"n": 1}, "list": [{"x": 1}, {"x": 2}]})
}

#[test]
fn lookups_read_paths_count_and_report_errors() {
    let d = doc();
    assert_eq!(lookup(&d, SubdocOp::Get, b"name").unwrap(), b"\"toy\"");
    assert_eq!(lookup(&d, SubdocOp::Get, b"list[-1].x").unwrap(), b"2");
    assert_eq!(lookup(&d, SubdocOp::GetCount, b"tags").unwrap(), b"2");
    assert_eq!(lookup(&d, SubdocOp::GetCount, b"d").unwrap(), b"1");
    assert!(lookup(&d, SubdocOp::Exists, b"d.n").is_ok());
    assert_eq!(
        lookup(&d, SubdocOp::Exists, b"d.m"),
        Err(SubdocError::PathNotFound)
    );
    assert_eq!(
        lookup(&d, SubdocOp::Get, b"tags.x"),
        Err(SubdocError::PathMismatch)
    );
    assert_eq!(
        lookup(&d, SubdocOp::Get, b"name[0]"),
        Err(SubdocError::PathMismatch)
    );
    assert_eq!(
        lookup(&d, SubdocOp::GetCount, b"name"),
        Err(SubdocError::PathMismatch)
    );
    assert_eq!(
        lookup(&d, SubdocOp::Get, b"tags[5]"),
        Err(SubdocError::PathNotFound)
    );
    // The whole document, in its key order.
    assert_eq!(
        lookup(&d, SubdocOp::Get, b"").unwrap(),
        serde_json::to_vec(&d).unwrap()
    );
}

#[test]
fn text_lookups_agree_with_parsed_lookups_and_keep_the_values_text() {
    let text =
        br#"{ "name" : "toy", "tags": ["a", "b"], "d": {"n": 1}, "list": [{"x": 1}, {"x": 2}] }"#;
    let d = parse_doc(text).unwrap();
    for path in [
        &b"name"[..],
        b"tags",
        b"tags[-1]",
        b"d",
        b"d.n",
        b"list[1].x",
        b"missing",
        b"name.x",
        b"tags[9]",
        b"d[0]",
        b"a..b",
    ] {
        for op in [SubdocOp::Get, SubdocOp::Exists, SubdocOp::GetCount] {
            let raw = lookup_raw(text, op, path, false);
            assert_eq!(lookup_raw(text, op, path, true), raw, "trusted");
            let parsed = lookup(&d, op, path);
            match (&raw, &parsed) {
                (Ok(r), Ok(p)) if op == SubdocOp::Get => {
                    let rv: Value = serde_json::from_slice(r).unwrap();
                    let pv: Value = serde_json::from_slice(p).unwrap();
                    assert_eq!(rv, pv, "{op:?} {}", String::from_utf8_lossy(path));
                }
                _ => assert_eq!(raw, parsed, "{op:?} {}", String::from_utf8_lossy(path)),
            }
        }
    }
    // The value's text as written.
    assert_eq!(
        lookup_raw(text, SubdocOp::Get, b"tags", false).unwrap(),
        br#"["a", "b"]"#
    );
    assert_eq!(
        lookup_raw(b"{\"a\":1", SubdocOp::Get, b"a", false),
        Err(SubdocError::DocNotJson)
    );
    assert_eq!(
        lookup_raw(b"{\"a\":1} x", SubdocOp::Exists, b"a", false),
        Err(SubdocError::DocNotJson)
    );
    assert_eq!(
        lookup_raw(b"[1,2]", SubdocOp::Get, b"", false).unwrap(),
        b"[1,2]"
    );
}

#[test]
fn mutations_change_only_their_path_and_keep_key_order() {
    let mut d = doc();
    mutate(&mut d, SubdocOp::DictUpsert, b"name", b"\"car\"", false).unwrap();
    mutate(&mut d, SubdocOp::DictAdd, b"new", b"{\"k\":true}", false).unwrap();
    assert_eq!(
        mutate(&mut d, SubdocOp::DictAdd, b"new", b"1", false),
        Err(SubdocError::PathExists)
    );
    assert_eq!(
        mutate(&mut d, SubdocOp::DictUpsert, b"x.y.z", b"1", false),
        Err(SubdocError::PathNotFound)
    );
    mutate(&mut d, SubdocOp::DictUpsert, b"x.y.z", b"1", true).unwrap();
    mutate(
        &mut d,
        SubdocOp::ArrayPushLast,
        b"tags",
        b"\"c\",\"d\"",
        false,
    )
    .unwrap();
    mutate(&mut d, SubdocOp::ArrayPushFirst, b"tags", b"\"z\"", false).unwrap();
    mutate(&mut d, SubdocOp::ArrayInsert, b"tags[1]", b"\"i\"", false).unwrap();
    assert_eq!(
        mutate(&mut d, SubdocOp::ArrayAddUnique, b"tags", b"\"a\"", false),
        Err(SubdocError::PathExists)
    );
    mutate(&mut d, SubdocOp::ArrayAddUnique, b"tags", b"\"u\"", false).unwrap();
    mutate(&mut d, SubdocOp::Delete, b"list[0]", b"", false).unwrap();
    mutate(&mut d, SubdocOp::Replace, b"d.n", b"[1,2]", false).unwrap();
    assert_eq!(
        mutate(&mut d, SubdocOp::Replace, b"d.missing", b"1", false),
        Err(SubdocError::PathNotFound)
    );
    assert_eq!(
        mutate(&mut d, SubdocOp::DictUpsert, b"name", b"not json", false),
        Err(SubdocError::ValueCantInsert)
    );
    assert_eq!(
        mutate(&mut d, SubdocOp::Counter, b"hits", b"5", false).unwrap(),
        b"5"
    );
    assert_eq!(
        mutate(&mut d, SubdocOp::Counter, b"hits", b"-7", false).unwrap(),
        b"-2"
    );
    assert_eq!(
        mutate(&mut d, SubdocOp::Counter, b"hits", b"0", false),
        Err(SubdocError::DeltaInvalid)
    );
    assert_eq!(
        mutate(&mut d, SubdocOp::Counter, b"name", b"1", false),
        Err(SubdocError::PathMismatch)
    );
    mutate(
        &mut d,
        SubdocOp::DictUpsert,
        b"big",
        b"9223372036854775807",
        false,
    )
    .unwrap();
    assert_eq!(
        mutate(&mut d, SubdocOp::Counter, b"big", b"1", false),
        Err(SubdocError::NumRange)
    );
    let text = String::from_utf8(serde_json::to_vec(&d).unwrap()).unwrap();
    assert_eq!(
        text,
        r#"{"name":"car","tags":["z","i","a","b","c","d","u"],"d":{"n":[1,2]},"list":[{"x":2}],"new":{"k":true},"x":{"y":{"z":1}},"hits":-2,"big":9223372036854775807}"#
    );
}

#[test]
fn created_documents_start_from_the_root_their_first_operation_needs() {
    assert_eq!(empty_root(SubdocOp::ArrayPushLast, b""), json!([]));
    assert_eq!(empty_root(SubdocOp::ArrayPushLast, b"a"), json!({}));
    assert_eq!(empty_root(SubdocOp::DictUpsert, b"a"), json!({}));
    let mut d = empty_root(SubdocOp::ArrayPushFirst, b"");
    mutate(&mut d, SubdocOp::ArrayPushFirst, b"", b"1", false).unwrap();
    assert_eq!(d, json!([1]));
}

#[test]
fn documents_and_values_too_deep_are_refused() {
    let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
    assert_eq!(parse_doc(deep.as_bytes()), Err(SubdocError::DocTooDeep));
    assert_eq!(parse_doc(b"{not json"), Err(SubdocError::DocNotJson));
    let mut d = json!({});
    assert_eq!(
        mutate(&mut d, SubdocOp::DictUpsert, b"a", deep.as_bytes(), false),
        Err(SubdocError::ValueTooDeep)
    );
}

mod model {
    //! Property tests against models: the text scanner against the parsed document,
    //! and the mutations against plain `serde_json` edits by JSON pointer.
    use super::super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<i32>().prop_map(Value::from),
            "[a-z ]{0,6}".prop_map(Value::from),
            any::<bool>().prop_map(Value::from),
            Just(Value::Null),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-c]", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn component() -> impl Strategy<Value = String> {
        prop_oneof!["[a-d]", (-1i64..4).prop_map(|i| format!("[{i}]"))]
    }

    fn path() -> impl Strategy<Value = String> {
        prop::collection::vec(component(), 0..4).prop_map(|cs| {
            let mut p = String::new();
            for c in cs {
                if !c.starts_with('[') && !p.is_empty() {
                    p.push('.');
                }
                p.push_str(&c);
            }
            p
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// The text scanner (checking or trusting the document) answers every lookup
        /// as a search of the parsed document does, on any document and path, with
        /// any spacing.
        #[test]
        fn text_lookups_match_the_parsed_document(doc in value(), p in path(), pretty in any::<bool>()) {
            let text = if pretty { serde_json::to_vec_pretty(&doc) } else { serde_json::to_vec(&doc) }.unwrap();
            for op in [SubdocOp::Get, SubdocOp::Exists, SubdocOp::GetCount] {
                let parsed = lookup(&doc, op, p.as_bytes());
                for trusted in [false, true] {
                    let raw = lookup_raw(&text, op, p.as_bytes(), trusted);
                    match (&raw, &parsed) {
                        (Ok(r), Ok(q)) if op == SubdocOp::Get => {
                            let rv: Value = serde_json::from_slice(r).unwrap();
                            let qv: Value = serde_json::from_slice(q).unwrap();
                            prop_assert_eq!(rv, qv);
                        }
                        _ => prop_assert_eq!(&raw, &parsed, "{:?} {} trusted {}", op, p, trusted),
                    }
                }
            }
        }

        /// DICT_UPSERT, DELETE and COUNTER on object keys do what the same edit by JSON
        /// pointer does, and leave the document unchanged when they fail.
        #[test]
        fn mutations_match_pointer_edits(
            doc in value(),
            keys in prop::collection::vec("[a-c]", 1..3),
            op in 0u8..3,
            n in -5i64..5,
        ) {
            let path = keys.join(".");
            let parent = format!("/{}", keys[..keys.len() - 1].join("/"));
            let parent = if keys.len() == 1 { String::new() } else { parent };
            let last = keys.last().unwrap().clone();
            let mut mine = doc.clone();
            let result = match op {
                0 => mutate(&mut mine, SubdocOp::DictUpsert, path.as_bytes(), n.to_string().as_bytes(), false),
                1 => mutate(&mut mine, SubdocOp::Delete, path.as_bytes(), b"", false),
                _ => mutate(&mut mine, SubdocOp::Counter, path.as_bytes(), n.to_string().as_bytes(), false),
            };
            let mut model = doc.clone();
            let expect_ok = match (op, model.pointer_mut(&parent)) {
                (_, Some(Value::Object(o))) => match op {
                    0 => { o.insert(last, json!(n)); true }
                    1 => o.shift_remove(&last).is_some(),
                    _ => {
                        let cur = o.get(&last).cloned().unwrap_or(json!(0));
                        match (n != 0, cur.as_i64().and_then(|c| c.checked_add(n))) {
                            (true, Some(next)) => { o.insert(last, json!(next)); true }
                            _ => false,
                        }
                    }
                },
                _ => false,
            };
            prop_assert_eq!(result.is_ok(), expect_ok, "{:?} {} on {}", op, path, doc);
            if result.is_ok() {
                prop_assert_eq!(&mine, &model);
            } else {
                prop_assert_eq!(&mine, &doc, "a failed mutation changed the document");
            }
        }
    }
}

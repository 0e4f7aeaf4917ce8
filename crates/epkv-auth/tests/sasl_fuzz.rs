//! Property tests: whatever bytes a client sends, the SASL server and the users-file
//! parser return a value or an error and never panic.

#![expect(clippy::unwrap_used, reason = "test code panics on failure")]

use std::sync::Arc;

use epkv_auth::{BucketAccess, SaslServer, UserStore};
use proptest::prelude::*;

fn users() -> Arc<UserStore> {
    let mut s = UserStore::empty().with_iterations(2);
    s.insert_with_password("user", "pencil", BucketAccess::All)
        .unwrap();
    Arc::new(s)
}

fn mechanism() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"PLAIN".to_vec()),
        Just(b"SCRAM-SHA1".to_vec()),
        Just(b"SCRAM-SHA256".to_vec()),
        Just(b"SCRAM-SHA512".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..24),
    ]
}

/// Bytes biased toward the SCRAM grammar so the parser's deeper branches are reached.
fn scramish() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"n,,".to_vec()),
        Just(b"y,,".to_vec()),
        Just(b"p=x,,".to_vec()),
        Just(b"a=user,".to_vec()),
        Just(b"n=user".to_vec()),
        Just(b"r=".to_vec()),
        Just(b"c=biws".to_vec()),
        Just(b",p=".to_vec()),
        Just(b",".to_vec()),
        Just(b"=2C".to_vec()),
        Just(b"=".to_vec()),
        Just(b"\0".to_vec()),
        "[ -~]{0,12}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..8),
    ];
    proptest::collection::vec(piece, 0..10).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(
        mech in mechanism(),
        first in proptest::collection::vec(any::<u8>(), 0..96),
        second in proptest::collection::vec(any::<u8>(), 0..96),
    ) {
        if let Ok((mut server, _)) = SaslServer::start(users(), &mech, &first) {
            let _ = server.step(&second);
            prop_assert!(server.is_finished());
        }
    }

    #[test]
    fn grammar_shaped_messages_never_panic(
        mech in mechanism(),
        first in scramish(),
        second in scramish(),
    ) {
        let mut full_first = b"n,,n=user,r=".to_vec();
        full_first.extend_from_slice(&first);
        for start in [&first, &full_first] {
            if let Ok((mut server, _)) = SaslServer::start(users(), &mech, start) {
                let _ = server.step(&second);
                let _ = server.step(&second);
            }
        }
    }

    #[test]
    fn users_file_parser_never_panics(text in "[\\[\\]a-z=\"*,.{} \\n0-9A-Z+/_-]{0,200}") {
        let _ = UserStore::parse_toml(&text);
        let shaped = format!("[[users]]\nname = \"u\"\n{text}");
        let _ = UserStore::parse_toml(&shaped);
    }
}

//! `application/x-www-form-urlencoded` bodies (what Couchbase's REST API takes) and
//! percent-encoded path segments.

use std::collections::BTreeMap;

/// Decodes `%XX` escapes (and `+` as a space when `plus_is_space`); `None` for a bad
/// escape or text that is not UTF-8.
pub(crate) fn percent_decode(s: &str, plus_is_space: bool) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// A decoded form: each field's last value.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Form(BTreeMap<String, String>);

impl Form {
    /// Parses a form body.
    ///
    /// # Errors
    /// A message naming the first field that is not valid percent-encoded UTF-8.
    pub(crate) fn parse(body: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(body).map_err(|_| "the body is not UTF-8".to_owned())?;
        let mut fields = BTreeMap::new();
        for pair in text.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let k = percent_decode(k, true)
                .ok_or_else(|| format!("field name {k:?} is not valid form encoding"))?;
            let v = percent_decode(v, true)
                .ok_or_else(|| format!("field {k:?} is not valid form encoding"))?;
            fields.insert(k, v);
        }
        Ok(Self(fields))
    }

    /// The value of `name`, if given.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// The first of `names` that is given.
    pub(crate) fn first_of(&self, names: &[&str]) -> Option<&str> {
        names.iter().find_map(|n| self.get(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_decode_escapes_plus_and_repeated_fields() {
        let f = Form::parse(b"name=a%20b&roles=admin%2Cdata_reader%5Bx%5D&q=1+2&q=3&flag").unwrap();
        assert_eq!(f.get("name"), Some("a b"));
        assert_eq!(f.get("roles"), Some("admin,data_reader[x]"));
        assert_eq!(f.get("q"), Some("3"), "the last value wins");
        assert_eq!(f.get("flag"), Some(""));
        assert_eq!(f.first_of(&["ramQuotaMB", "q"]), Some("3"));
        assert!(Form::parse(b"a=%zz").is_err());
        assert!(Form::parse(b"a=%e2%28").is_err(), "not UTF-8");
        assert!(Form::parse(&[0xff]).is_err());
        assert_eq!(Form::parse(b"").unwrap(), Form::default());
    }

    #[test]
    fn path_segments_keep_plus() {
        assert_eq!(percent_decode("a+b%25", false).as_deref(), Some("a+b%"));
        assert_eq!(percent_decode("%4", false), None);
    }
}

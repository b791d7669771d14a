//! `GET /v1/responses/{id}/input_items`: the items a response was created from (its own
//! `input`, not the turns of `previous_response_id`), as the API lists them: each with
//! an id and a `type`, a message's text as content parts, in pages (`order`, `after`,
//! `limit`) of a `list` with `first_id`, `last_id` and `has_more`.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::protocol::Input;
use crate::http::error::ApiError;

/// Default page size, as OpenAI's.
pub(crate) const DEFAULT_LIMIT: usize = 20;
/// Largest page, as OpenAI's.
pub(crate) const MAX_LIMIT: usize = 100;

/// The items of `input` as they are listed later: each gets an id (`msg_…`, `fc_…`,
/// `fco_…`) unless it has one, a `type`, and a `status`; a message's string content
/// becomes one text part (`output_text` for the assistant, `input_text` otherwise).
pub(crate) fn listed_items(input: &Input) -> Vec<Value> {
    match input {
        Input::Text(text) => vec![listed(json!({"type": "message", "role": "user", "content": text}))],
        Input::Items(items) => items.iter().cloned().map(listed).collect(),
    }
}

fn listed(mut item: Value) -> Value {
    let Some(fields) = item.as_object_mut() else { return item };
    let kind = fields.get("type").and_then(Value::as_str).unwrap_or("message").to_string();
    if kind == "message" {
        let part = if fields.get("role").and_then(Value::as_str) == Some("assistant") { "output_text" } else { "input_text" };
        if let Some(Value::String(text)) = fields.get("content") {
            let text = text.clone();
            fields.insert("content".into(), json!([{"type": part, "text": text}]));
        }
    }
    if !fields.get("id").is_some_and(Value::is_string) {
        let prefix = match kind.as_str() {
            "function_call" => "fc",
            "function_call_output" => "fco",
            "reasoning" => "rs",
            _ => "msg",
        };
        fields.insert("id".into(), format!("{prefix}_{}", uuid::Uuid::new_v4().simple()).into());
    }
    fields.insert("type".into(), kind.into());
    fields.entry("status").or_insert_with(|| "completed".into());
    item
}

/// Query of `GET /v1/responses/{id}/input_items` (`include` is not read: nothing extra
/// is kept to include).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ItemsQuery {
    /// `asc` or `desc` (the default, newest first).
    #[serde(default)]
    pub order: Option<String>,
    /// List the items after this item id (in `order`).
    #[serde(default)]
    pub after: Option<String>,
    /// 1 to [`MAX_LIMIT`] (default [`DEFAULT_LIMIT`]).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// One page of input items.
#[derive(Debug, Serialize)]
pub(crate) struct ItemList {
    pub object: &'static str,
    pub data: Vec<Value>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}

fn id_of(item: &Value) -> Option<&str> {
    item.get("id").and_then(Value::as_str)
}

/// The page of `items` (in creation order) that `query` asks for.
pub(crate) fn page(items: &[Value], query: &ItemsQuery) -> Result<ItemList, ApiError> {
    let descending = match query.order.as_deref() {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return Err(ApiError::bad_field(format!("order must be 'asc' or 'desc', got '{other}'"), Some("order".into())))
        }
    };
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::bad_field(format!("limit must be between 1 and {MAX_LIMIT}, got {limit}"), Some("limit".into())));
    }
    let ordered: Vec<&Value> = if descending { items.iter().rev().collect() } else { items.iter().collect() };
    let start = match &query.after {
        None => 0,
        Some(after) => match ordered.iter().position(|item| id_of(item) == Some(after.as_str())) {
            Some(at) => at + 1,
            None => {
                return Err(ApiError::bad_field(
                    format!("no input item with id '{after}' in this response"),
                    Some("after".into()),
                ))
            }
        },
    };
    let rest = &ordered[start..];
    let data: Vec<Value> = rest.iter().take(limit).map(|item| (*item).clone()).collect();
    Ok(ItemList {
        object: "list",
        first_id: data.first().and_then(id_of).map(str::to_string),
        last_id: data.last().and_then(id_of).map(str::to_string),
        has_more: rest.len() > limit,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(order: Option<&str>, after: Option<&str>, limit: Option<usize>) -> ItemsQuery {
        ItemsQuery { order: order.map(str::to_string), after: after.map(str::to_string), limit }
    }

    #[test]
    fn items_get_ids_types_and_text_parts() {
        let items = listed_items(&Input::Text("hi".into()));
        assert_eq!(items.len(), 1);
        assert!(items[0]["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(items[0]["content"], json!([{"type": "input_text", "text": "hi"}]));
        assert_eq!((items[0]["role"].as_str(), items[0]["status"].as_str()), (Some("user"), Some("completed")));

        let items = listed_items(&Input::Items(vec![
            json!({"role": "assistant", "content": "a"}),
            json!({"type": "function_call_output", "call_id": "c", "output": "x", "id": "mine"}),
        ]));
        assert_eq!(items[0]["type"], "message");
        assert_eq!(items[0]["content"][0]["type"], "output_text");
        assert_eq!(items[1]["id"], "mine");
    }

    #[test]
    fn pages_in_either_order() {
        let items: Vec<Value> = (0..5).map(|i| json!({"id": format!("i{i}")})).collect();
        let ids = |list: &ItemList| list.data.iter().filter_map(id_of).map(str::to_string).collect::<Vec<_>>();

        let all = page(&items, &ItemsQuery::default()).unwrap();
        assert_eq!(ids(&all), ["i4", "i3", "i2", "i1", "i0"], "newest first by default");
        assert!(!all.has_more);

        let first = page(&items, &query(Some("asc"), None, Some(2))).unwrap();
        assert_eq!(ids(&first), ["i0", "i1"]);
        assert_eq!((first.first_id.as_deref(), first.last_id.as_deref(), first.has_more), (Some("i0"), Some("i1"), true));
        let next = page(&items, &query(Some("asc"), first.last_id.as_deref(), Some(2))).unwrap();
        assert_eq!(ids(&next), ["i2", "i3"]);
        let last = page(&items, &query(Some("asc"), Some("i3"), Some(2))).unwrap();
        assert_eq!((ids(&last), last.has_more), (vec!["i4".to_string()], false));
        let none = page(&items, &query(Some("desc"), Some("i0"), None)).unwrap();
        assert!(none.data.is_empty() && none.first_id.is_none() && !none.has_more);

        for (q, param) in [
            (query(Some("up"), None, None), "order"),
            (query(None, None, Some(0)), "limit"),
            (query(None, None, Some(101)), "limit"),
            (query(None, Some("nope"), None), "after"),
        ] {
            assert_eq!(page(&items, &q).unwrap_err().body.error.param.as_deref(), Some(param));
        }
    }
}

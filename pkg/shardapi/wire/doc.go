// Package wire holds hand-written JSON codecs for the hot messages of the shard API (package
// shardapi): the claim reply, the complete and release requests and their replies. Every claimed
// row crosses JSON four times, and encoding/json's reflection dominated the CPU of both the keeper
// and its workers (issue 14).
//
// The codecs do not define a dialect of their own:
//
//   - The Append functions produce exactly the bytes json.Marshal gives for the same value (HTML
//     escaping of <, > and &, U+2028 and U+2029 escaped, invalid UTF-8 as \ufffd, times as
//     time.Time.MarshalJSON writes them, numbers as encoding/json formats them), and fail where
//     json.Marshal fails (a time outside years 0-9999, a NaN or infinite cadence).
//   - The Decode functions accept a plain subset of JSON (an object with the message's field
//     names spelled exactly, each at most once, any JSON whitespace, strings with any escapes,
//     numbers, and true, false or null where the field's type takes them) and decline
//     everything else, without an error of their own. A caller decodes a declined body with
//     encoding/json as before, so every error, limit and oddity of the reference decoding (unknown
//     or differently cased field names, duplicates, trailing data) stays what it was. What a Decode
//     function accepts, encoding/json accepts too, into the same value: the fuzz tests of this
//     package and of package httpserve check that against encoding/json.
package wire

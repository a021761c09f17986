package httpserve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/shardapi/wire"
)

// MaxRequestBytes bounds the body of every API request. It is sized so that a complete or
// release of a full claim batch (shardapi.MaxClaim items) fits with keys of the longest length
// (schedule.MaxKeyBytes) and a nextDue each: about 2,150 bytes per item.
const MaxRequestBytes = 24 << 20

// WriteJSON writes v as the JSON reply with status code (500 when v does not encode). The hot
// replies (shardapi.ClaimResponse, CompleteResponse and ReleaseResponse) are encoded by package
// wire, byte for byte as encoding/json writes them; Codec.WriteJSON reuses their buffers.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	writeJSON(w, code, v, nil)
}

// writeJSON is WriteJSON with the reply buffers of pool (nil: none kept).
func writeJSON(w http.ResponseWriter, code int, v any, pool *sync.Pool) {
	bp := getBuffer(pool)
	defer putBuffer(pool, bp)
	b, err := appendFast((*bp)[:0], v)
	if errors.Is(err, errNotFast) {
		var buf bytes.Buffer
		err = json.NewEncoder(&buf).Encode(v)
		b = buf.Bytes()
	} else if err == nil {
		b = append(b, '\n') // as json.Encoder.Encode ends a value
		*bp = b
	}
	if err != nil {
		http.Error(w, `{"error":"encoding the reply failed"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b))) // lets a client size its buffer
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// WriteError writes the JSON error reply (shardapi.Error) msg with status code.
func WriteError(w http.ResponseWriter, code int, msg string) {
	WriteJSON(w, code, shardapi.Error{Error: msg})
}

// Decode reads the JSON body of r into v strictly: size-limited, no unknown fields, one value.
// A request whose "items" array holds more than shardapi.MaxClaim items is refused as soon as
// the item after the last allowed one starts, without reading or decoding the rest of the body.
// A body that does not decode is answered (400, 408 or 413) and Decode returns false.
//
// A complete or release request with a Content-Length of at most MaxFastBodyBytes is read into
// a buffer and, when it is in package wire's plain grammar, decoded without reflection (see
// decodeFast); any other body, or one the fast path declines, is decoded from the same bytes by
// encoding/json as described above, so the replies are the same. Codec.Decode reuses the
// buffers of those bodies.
func Decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return decode(w, r, v, nil)
}

// decode is Decode with the body buffers of pool (nil: none kept).
func decode(w http.ResponseWriter, r *http.Request, v any, pool *sync.Pool) bool {
	body := http.MaxBytesReader(w, r.Body, MaxRequestBytes)
	var src io.Reader = body
	if r.ContentLength >= 0 && r.ContentLength <= MaxFastBodyBytes {
		var scan wire.RequestScan
		fast := true
		switch v.(type) {
		case *shardapi.CompleteRequest:
			scan = wire.NewCompleteScan(shardapi.MaxClaim)
		case *shardapi.ReleaseRequest:
			scan = wire.NewReleaseScan(shardapi.MaxClaim)
		default:
			fast = false
		}
		if fast {
			bp := getBuffer(pool)
			defer putBuffer(pool, bp)
			done, ok, read := decodeFast(w, body, r.ContentLength, bp, &scan, v)
			if done {
				return ok
			}
			src = io.MultiReader(bytes.NewReader(read), body)
		}
	}
	dec := json.NewDecoder(src)
	dec.DisallowUnknownFields()
	var err error
	if items, ok := itemsField(v); ok {
		err = decodeWithItems(dec, v, items)
	} else {
		err = dec.Decode(v)
	}
	if err != nil {
		var tooBig *http.MaxBytesError
		var tooMany errTooManyItems
		switch {
		case errors.As(err, &tooBig):
			WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", MaxRequestBytes))
		case errors.As(err, &tooMany):
			WriteError(w, http.StatusRequestEntityTooLarge, err.Error())
		case timedOut(err):
			writeBodyError(w, err)
		case errors.Is(err, io.EOF):
			WriteError(w, http.StatusBadRequest, "empty request body: want a JSON object")
		default:
			WriteError(w, http.StatusBadRequest, "malformed JSON body: "+err.Error())
		}
		return false
	}
	if dec.More() {
		WriteError(w, http.StatusBadRequest, "malformed JSON body: more than one JSON value")
		return false
	}
	switch _, err := dec.Token(); {
	case errors.Is(err, io.EOF):
		return true
	case timedOut(err):
		// a whole JSON object, then the body stopped short of its Content-Length: 408, not
		// "trailing data"
		writeBodyError(w, err)
	default:
		WriteError(w, http.StatusBadRequest, "malformed JSON body: trailing data after the JSON object")
	}
	return false
}

// timedOut says whether err is a read that hit its deadline.
func timedOut(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}

// errTooManyItems refuses a request whose items array is longer than shardapi.MaxClaim.
type errTooManyItems struct{}

func (errTooManyItems) Error() string {
	return fmt.Sprintf("more than %d items: a request carries at most %d (the largest claim)", shardapi.MaxClaim, shardapi.MaxClaim)
}

// itemsField returns the field of the struct *v that holds the "items" array, if it has one.
func itemsField(v any) (reflect.Value, bool) {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct {
		return reflect.Value{}, false
	}
	st := rv.Elem().Type()
	for i := range st.NumField() {
		name, _, _ := strings.Cut(st.Field(i).Tag.Get("json"), ",")
		if name == "items" && st.Field(i).Type.Kind() == reflect.Slice {
			return rv.Elem().Field(i), true
		}
	}
	return reflect.Value{}, false
}

// decodeWithItems decodes one JSON object into v, reading the array of its "items" member
// element by element into items (at most shardapi.MaxClaim of them) and every other member as
// encoding/json would (strictly: dec's settings apply to both).
func decodeWithItems(dec *json.Decoder, v any, items reflect.Value) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("want a JSON object, got %v", tok)
	}
	rest := []byte{'{'}
	seenItems := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		name := tok.(string) // object keys are strings; the decoder checks the syntax
		var raw json.RawMessage
		if !strings.EqualFold(name, "items") {
			if err := dec.Decode(&raw); err != nil {
				return err
			}
			if len(rest) > 1 {
				rest = append(rest, ',')
			}
			key, _ := json.Marshal(name)
			rest = append(append(append(rest, key...), ':'), raw...)
			continue
		}
		if seenItems {
			return errors.New(`"items" given twice`)
		}
		seenItems = true
		if err := decodeItems(dec, items); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return err
	}
	// the other members, strictly; Decode leaves items alone (it is not among them)
	rest = append(rest, '}')
	strict := json.NewDecoder(bytes.NewReader(rest))
	strict.DisallowUnknownFields()
	return strict.Decode(v)
}

// decodeItems reads a JSON array (or null) element by element into the slice items.
func decodeItems(dec *json.Decoder, items reflect.Value) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		items.SetZero()
		return nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return fmt.Errorf(`"items" must be an array, got %v`, tok)
	}
	out := reflect.MakeSlice(items.Type(), 0, 16)
	elem := items.Type().Elem()
	for dec.More() {
		if out.Len() == shardapi.MaxClaim {
			return errTooManyItems{}
		}
		p := reflect.New(elem)
		if err := dec.Decode(p.Interface()); err != nil {
			return fmt.Errorf("item %d: %w", out.Len(), err)
		}
		out = reflect.Append(out, p.Elem())
	}
	if _, err := dec.Token(); err != nil { // the closing ']'
		return err
	}
	items.Set(out)
	return nil
}

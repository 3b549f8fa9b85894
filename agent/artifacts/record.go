package artifacts

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
)

// The record beside an artifact's object is signed with HMAC-SHA256 under a
// key derived from artifact_store.record_secret. The signature covers the
// object's key and entity tag as well as the BUILT fields: a record cannot
// be moved to another key, and an object replaced after it was recorded
// (its entity tag changes with its content) no longer matches it.

// recordKeyLabel separates the record key from any other use of the same
// secret.
const recordKeyLabel = "cube-templatecenter artifact record key v1"

// recordVersion is the envelope's version; records of another are refused.
const recordVersion = 1

// signedRecord is the envelope stored as <key>.json.
type signedRecord struct {
	Version int             `json:"version"`
	ETag    string          `json:"etag"`
	Built   json.RawMessage `json:"built"`
	MAC     string          `json:"hmac_sha256"`
}

// deriveRecordKey turns the configured secret into the record key; nil for
// no secret.
func deriveRecordKey(secret string) []byte {
	if secret == "" {
		return nil
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(recordKeyLabel))
	return m.Sum(nil)
}

// recordMAC signs what a record vouches for: the object's key and entity
// tag, and the BUILT fields as stored. Each part is length-prefixed, so no
// two different inputs sign the same bytes.
func recordMAC(recordKey []byte, objectKey, etag string, built []byte) []byte {
	m := hmac.New(sha256.New, recordKey)
	for _, part := range [][]byte{[]byte(objectKey), []byte(etag), built} {
		fmt.Fprintf(m, "%d:", len(part))
		m.Write(part)
	}
	return m.Sum(nil)
}

// sealRecord encodes built as the signed record of the object at
// objectKey with entity tag etag.
func sealRecord(recordKey []byte, objectKey, etag string, built api.Built) ([]byte, error) {
	data, err := json.Marshal(built)
	if err != nil {
		return nil, fmt.Errorf("encode artifact record: %w", err)
	}
	mac := recordMAC(recordKey, objectKey, etag, data)
	return json.Marshal(signedRecord{Version: recordVersion, ETag: etag, Built: data, MAC: hex.EncodeToString(mac)})
}

// openRecord checks a record read beside the object at objectKey, whose
// entity tag is now etag, and returns its BUILT fields. On failure reason is
// recordUnsigned or recordSignature.
func openRecord(recordKey []byte, objectKey, etag string, data []byte) (api.Built, string, error) {
	var env signedRecord
	if err := json.Unmarshal(data, &env); err != nil || env.Version != recordVersion || env.MAC == "" || len(env.Built) == 0 {
		return api.Built{}, recordUnsigned, errors.New("not a signed artifact record")
	}
	mac, err := hex.DecodeString(env.MAC)
	if err != nil || !hmac.Equal(mac, recordMAC(recordKey, objectKey, env.ETag, env.Built)) {
		return api.Built{}, recordSignature, errors.New("the record's signature does not verify (another record_secret, or not written by TC)")
	}
	if env.ETag != etag {
		return api.Built{}, recordMismatch, fmt.Errorf("the object changed after it was recorded (entity tag %q, recorded %q)", etag, env.ETag)
	}
	var built api.Built
	if err := json.Unmarshal(env.Built, &built); err != nil {
		return api.Built{}, recordSignature, fmt.Errorf("decode signed artifact record: %w", err)
	}
	built.TemplateCheck = boundCheck(built.TemplateCheck)
	return built, "", nil
}

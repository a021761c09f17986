package rowstore

import (
	"errors"
	"fmt"
)

// Check verifies the key index against the records: every held record is in it once, and
// nothing else is. It visits every record: for tests.
func (s *Store) Check() error {
	var errs []error
	inIndex := map[uint32]bool{}
	for _, e := range s.index.slots {
		if e == 0 {
			continue
		}
		id := e&idMask - 1
		if held := s.recs.at(id).msFlags&uint16(Held) != 0; inIndex[id] || !held {
			errs = append(errs, fmt.Errorf("index entry for record %d: twice %v, held %v", id, inIndex[id], held))
		}
		inIndex[id] = true
	}
	if len(inIndex) != s.recs.n || s.index.n != s.recs.n {
		errs = append(errs, fmt.Errorf("index holds %d records (counts %d), %d held", len(inIndex), s.index.n, s.recs.n))
	}
	return errors.Join(errs...)
}

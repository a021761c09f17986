package shardtls

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/renderqueue/renderqueue/pkg/certs"
)

// DefaultCARefresh is how often CAStore reads its Secret again (a CA replaced by hand, or by
// another replica, is picked up within it).
const DefaultCARefresh = 10 * time.Minute

// CAStore keeps the operator's shard CA in a Secret of its own namespace (type Opaque, keys
// certs.KeyCACert and certs.KeyCAKey): it creates the Secret with a new CA when it is missing,
// and renews the CA a year before its end, keeping the old one in the bundle until it expires
// (certs.RenewCA). It reads that one Secret (the operator's Role grants get and update on it by
// name) with an uncached reader: the operator neither lists nor watches Secrets.
type CAStore struct {
	// Reader reads the Secret (uncached: the manager's API reader); Writer creates and updates
	// it.
	Reader client.Reader
	Writer client.Writer
	// Secret is the CA Secret, namespace/name.
	Secret types.NamespacedName
	// Refresh is how often the Secret is read again; DefaultCARefresh when 0.
	Refresh time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	Log logr.Logger

	mu   sync.Mutex
	ca   *certs.CA
	read time.Time
}

// CA returns the current shard CA, reading (and if needed creating or renewing) the Secret when
// it was not read within Refresh or the CA held is due for renewal.
func (s *CAStore) CA(ctx context.Context) (*certs.CA, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	refresh := s.Refresh
	if refresh <= 0 {
		refresh = DefaultCARefresh
	}
	if s.ca != nil && now.Sub(s.read) < refresh && now.Add(certs.CARenewBefore).Before(s.ca.Cert.NotAfter) {
		return s.ca, nil
	}
	var err error
	for range 2 {
		var ca *certs.CA
		if ca, err = s.sync(ctx, now); err == nil {
			s.ca, s.read = ca, now
			return ca, nil
		}
		if !errors.Is(err, errLostRace) {
			break
		}
	}
	return nil, err
}

func (s *CAStore) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// errLostRace: someone else wrote the Secret between this read and write; read it again.
var errLostRace = errors.New("the shard CA Secret changed under this write")

func (s *CAStore) sync(ctx context.Context, now time.Time) (*certs.CA, error) {
	var secret corev1.Secret
	err := s.Reader.Get(ctx, s.Secret, &secret)
	switch {
	case apierrors.IsNotFound(err):
		ca, _, err := certs.RenewCA(nil, caName(now), now)
		if err != nil {
			return nil, err
		}
		data, err := certs.CAData(ca)
		if err != nil {
			return nil, err
		}
		secret = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.Secret.Namespace, Name: s.Secret.Name, Labels: map[string]string{
				"app.kubernetes.io/name": "renderqueue-operator", "app.kubernetes.io/component": "shard-ca"}},
			Type: corev1.SecretTypeOpaque,
			Data: data,
		}
		if err := s.Writer.Create(ctx, &secret); apierrors.IsAlreadyExists(err) {
			return nil, errLostRace
		} else if err != nil {
			return nil, fmt.Errorf("creating the shard CA Secret %s: %w", s.Secret, err)
		}
		s.Log.Info("Created the shard CA", "secret", s.Secret.String(), "fingerprint", ca.Fingerprint())
		return ca, nil
	case err != nil:
		return nil, fmt.Errorf("reading the shard CA Secret %s: %w", s.Secret, err)
	}
	ca, why, err := certs.RenewCA(secret.Data, caName(now), now)
	if err != nil {
		return nil, err
	}
	if why == "" {
		return ca, nil
	}
	data, err := certs.CAData(ca)
	if err != nil {
		return nil, err
	}
	secret.Data = data
	if err := s.Writer.Update(ctx, &secret); apierrors.IsConflict(err) {
		return nil, errLostRace
	} else if err != nil {
		return nil, fmt.Errorf("renewing the shard CA in %s (%s): %w", s.Secret, why, err)
	}
	s.Log.Info("Renewed the shard CA", "secret", s.Secret.String(), "reason", why, "fingerprint", ca.Fingerprint())
	return ca, nil
}

func caName(now time.Time) string { return fmt.Sprintf("renderqueue-shard-ca@%d", now.Unix()) }

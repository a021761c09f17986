package keeper

import "context"

// SettingsSource supplies a shard's settings: the first at start, then every change. Standalone
// runs use StaticSource; shards managed by the operator watch their RenderQueue object.
type SettingsSource interface {
	// Initial returns the settings to start with.
	Initial(ctx context.Context) (Settings, error)
	// Watch sends every later change on ch until ctx ends, then returns ctx's error.
	Watch(ctx context.Context, ch chan<- Settings) error
}

// StaticSource is a settings source that never changes: the standalone mode.
type StaticSource struct {
	Settings Settings
}

// Initial returns the fixed settings.
func (s StaticSource) Initial(context.Context) (Settings, error) { return s.Settings, nil }

// Watch sends nothing and returns when ctx ends.
func (s StaticSource) Watch(ctx context.Context, _ chan<- Settings) error {
	<-ctx.Done()
	return ctx.Err()
}

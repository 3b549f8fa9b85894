package images

import (
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// StoreTemps lists the temporary images (<id>.ext4.tmp-…) a build left
// anywhere under the artifact store dir.
func StoreTemps(tb testing.TB, dir string) []string {
	tb.Helper()
	var temps []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.Contains(d.Name(), ".ext4.tmp-") {
			temps = append(temps, path)
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("scan %s: %v", dir, err)
	}
	return temps
}

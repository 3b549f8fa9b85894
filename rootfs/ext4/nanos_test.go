package ext4

import (
	"math"
	"testing"
	"time"
)

func TestNanos(t *testing.T) {
	tests := []struct {
		name string
		in   time.Time
		want int64
	}{
		{"Zero", time.Time{}, 0},
		{"Epoch", time.Unix(0, 0), 0},
		{"Recent", time.Date(2024, 6, 1, 12, 0, 0, 987654321, time.UTC), 1717243200987654321},
		{"Before1970", time.Date(1960, 1, 1, 0, 0, 0, 5, time.UTC), -315619199999999995},
		{"TooEarly", time.Date(1500, 1, 1, 0, 0, 0, 0, time.UTC), math.MinInt64},
		{"TooLate", time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC), math.MaxInt64},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Nanos(tc.in); got != tc.want {
				t.Errorf("Nanos(%v) = %d, want %d", tc.in, got, tc.want)
			}
		})
	}
}

package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"text/tabwriter"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/inspect"
)

// inspectImage lists a directory of a template image, or prints a file,
// without mounting it.
func inspectImage(_ context.Context, args []string, stdout io.Writer) error {
	if len(args) < 1 || len(args) > 2 {
		return fmt.Errorf("%w: inspect IMAGE.ext4 [PATH]", errUsage)
	}
	p := "/"
	if len(args) == 2 {
		p = args[1]
	}
	im, err := inspect.Open(args[0])
	if err != nil {
		return err
	}
	defer im.Close()
	e, err := im.Stat(p)
	if err != nil {
		return err
	}
	switch {
	case e.Mode.IsDir():
		entries, err := im.List(p)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 1, ' ', tabwriter.AlignRight)
		for _, e := range entries {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t %s\n", e.Mode, e.UID, e.GID, e.Size, e.ModTime.UTC().Format("2006-01-02 15:04"), describe(e))
		}
		return tw.Flush()
	case e.Mode.IsRegular():
		data, err := im.ReadFile(p)
		if err != nil {
			return err
		}
		_, err = stdout.Write(data)
		return err
	default:
		fmt.Fprintf(stdout, "%s %d:%d %s\n", e.Mode, e.UID, e.GID, describe(e))
		return nil
	}
}

func describe(e inspect.Entry) string {
	switch {
	case e.Mode&fs.ModeSymlink != 0:
		return e.Name + " -> " + e.LinkTarget
	case e.Mode&fs.ModeDevice != 0:
		return fmt.Sprintf("%s (%d, %d)", e.Name, e.Major, e.Minor)
	default:
		return e.Name
	}
}

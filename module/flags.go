package module

import (
	"fmt"

	"github.com/spf13/pflag"
)

// EnvAnnotation is the flag annotation naming the environment variable that
// supplies the flag's value when the flag is not given on the command line.
const EnvAnnotation = "sluice_env"

// BindEnv makes the environment variable env the fallback of flag name.
func BindEnv(fs *pflag.FlagSet, name, env string) {
	_ = fs.SetAnnotation(name, EnvAnnotation, []string{env})
	f := fs.Lookup(name)
	f.Usage += fmt.Sprintf(" [$%s]", env)
}

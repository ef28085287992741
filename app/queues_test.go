package app_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
)

func TestParseQueues(t *testing.T) {
	t.Parallel()

	queues, err := app.ParseQueues("default=20,emails=5,bulk_mail-2=10000")
	require.NoError(t, err)
	require.Equal(t, map[string]int{"default": 20, "emails": 5, "bulk_mail-2": 10000}, queues)
	require.Equal(t, "bulk_mail-2=10000,default=20,emails=5", app.FormatQueues(queues))

	for in, want := range map[string]string{
		"":                  "want QUEUE=N[,QUEUE=N...]",
		"emails":            `"emails": want QUEUE=N`,
		"emails=":           `"" is not a number of jobs`,
		"=5":                `invalid queue name ""`,
		"emails=5,":         `"": want QUEUE=N`,
		"emails=1.5":        `"1.5" is not a number of jobs`,
		"emails=0":          `queue "emails": jobs at once must be between 1 and 10000, got 0`,
		"emails=10001":      "got 10001",
		"e mails=1":         `invalid queue name "e mails"`,
		"emails=1,emails=2": `queue "emails" is given twice`,
		"maintenance=1":     `queue "maintenance" is sluice's own`,
	} {
		_, err := app.ParseQueues(in)
		require.ErrorContains(t, err, want, "%q", in)
	}
}

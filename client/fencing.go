package client

// FencingToken is t's lease epoch: how many times t was claimed
// (Task.claims). It rises with every claim and stays the same while the
// holder renews its lease or changes the task keeping its claim, so a
// worker whose lease ran out, and whose task another worker then claimed,
// holds a lower token than the new holder. Send it with every side effect
// in another system, and have that system refuse a token lower than the
// highest it has seen for the task: a paused worker that wakes up after
// losing its task cannot overwrite the new holder's work there
// (docs/workers.md, "Fencing side effects"). The Worker's handler gets the
// task as claimed, token included. The count starts again for a task
// deleted and inserted anew with the same id: fence by (id, created).
func FencingToken(t *Task) uint32 { return t.GetClaims() }

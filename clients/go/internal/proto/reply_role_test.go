// Tests of RoleReplicas, the replica count of replica sync's default (reply.go).
package proto

import "testing"

func TestRoleReplicasCountsAPrimarysListedReplicasOnly(t *testing.T) {
	replica := []interface{}{"127.0.0.1", "7001", "10"}
	cases := []struct {
		role []interface{}
		want int
	}{
		{[]interface{}{"master", int64(10), []interface{}{}}, 0},
		{[]interface{}{"master", int64(10), []interface{}{replica, replica}}, 2},
		{[]interface{}{"slave", "127.0.0.1", int64(6379), "connected", int64(10)}, 0},
		{[]interface{}{"master"}, 0},
	}
	for _, c := range cases {
		if got := RoleReplicas(c.role); got != c.want {
			t.Errorf("RoleReplicas(%v) = %d, want %d", c.role, got, c.want)
		}
	}
}

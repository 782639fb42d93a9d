// Command validate checks rendered Kubernetes manifests (the output of
// `helm template`) with no cluster and no network: every object must
// decode strictly (no unknown or duplicate field, every value of its
// field's type) into the Go type the API server would decode it into,
// from k8s.io/api and prometheus-operator's monitoring/v1; an object of
// another kind is an error. A few checks the types cannot express follow:
// a workload's selector matches its pod template's labels, a
// resourceFieldRef names a container of its pod, and a container that
// reads its memory limit through the downward API has one.
//
// It is a module of its own so that the Kubernetes packages stay out of
// Taskstore's module and binaries: `make helm-check` runs it.
//
//	go run . FILE...
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// kinds maps apiVersion/kind to a new object of its Go type.
var kinds = map[string]func() any{
	"v1/Service":                              func() any { return &corev1.Service{} },
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                               func() any { return &corev1.Secret{} },
	"v1/ServiceAccount":                       func() any { return &corev1.ServiceAccount{} },
	"v1/Namespace":                            func() any { return &corev1.Namespace{} },
	"v1/PersistentVolumeClaim":                func() any { return &corev1.PersistentVolumeClaim{} },
	"apps/v1/StatefulSet":                     func() any { return &appsv1.StatefulSet{} },
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"batch/v1/CronJob":                        func() any { return &batchv1.CronJob{} },
	"policy/v1/PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: validate FILE...")
		os.Exit(2)
	}
	var nobj, nerr int
	for _, path := range os.Args[1:] {
		n, errs := validateFile(path)
		nobj += n
		for _, err := range errs {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
		}
		nerr += len(errs)
	}
	fmt.Printf("%d objects in %d files, %d errors\n", nobj, len(os.Args)-1, nerr)
	if nerr > 0 || nobj == 0 {
		os.Exit(1)
	}
}

func validateFile(path string) (int, []error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, []error{err}
	}
	defer f.Close()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var n int
	var errs []error
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, append(errs, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		n++
		if err := validateDoc(doc); err != nil {
			errs = append(errs, err)
		}
	}
	return n, errs
}

func validateDoc(doc []byte) error {
	var tm metav1.TypeMeta
	var om struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	_ = yaml.Unmarshal(doc, &om)
	what := fmt.Sprintf("%s %s/%s", tm.APIVersion, tm.Kind, om.Metadata.Name)
	newObj, ok := kinds[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return fmt.Errorf("%s: a kind this validator does not know", what)
	}
	obj := newObj()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if om.Metadata.Name == "" {
		return fmt.Errorf("%s: no metadata.name", what)
	}
	var sel *metav1.LabelSelector
	var tmpl *corev1.PodTemplateSpec
	switch o := obj.(type) {
	case *appsv1.StatefulSet:
		sel, tmpl = o.Spec.Selector, &o.Spec.Template
		if o.Spec.ServiceName == "" {
			return fmt.Errorf("%s: no serviceName", what)
		}
	case *appsv1.Deployment:
		sel, tmpl = o.Spec.Selector, &o.Spec.Template
	case *policyv1.PodDisruptionBudget:
		if o.Spec.Selector == nil || (o.Spec.MaxUnavailable == nil && o.Spec.MinAvailable == nil) {
			return fmt.Errorf("%s: needs a selector and maxUnavailable or minAvailable", what)
		}
	}
	if tmpl == nil {
		return nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() || !s.Matches(labels.Set(tmpl.Labels)) {
		return fmt.Errorf("%s: selector %v does not match the pod template's labels %v (%v)", what, sel, tmpl.Labels, err)
	}
	names := map[string]corev1.Container{}
	for _, c := range tmpl.Spec.Containers {
		names[c.Name] = c
	}
	for _, c := range tmpl.Spec.Containers {
		for _, e := range c.Env {
			if e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil {
				continue
			}
			ref := e.ValueFrom.ResourceFieldRef
			target, ok := names[ref.ContainerName]
			if ref.ContainerName != "" && !ok {
				return fmt.Errorf("%s: env %s of %s reads the resources of container %q, which is not in the pod", what, e.Name, c.Name, ref.ContainerName)
			}
			if !ok {
				target = c
			}
			if ref.Resource == "limits.memory" {
				if _, has := target.Resources.Limits[corev1.ResourceMemory]; !has {
					return fmt.Errorf("%s: env %s reads limits.memory of %s, which sets none (it would be the machine's memory)", what, e.Name, target.Name)
				}
			}
		}
	}
	return nil
}

// stripComments drops comment-only lines, so that a document of comments
// alone (helm leaves some) is not counted as an object.
func stripComments(doc []byte) []byte {
	var out []string
	for _, l := range strings.Split(string(doc), "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			out = append(out, l)
		}
	}
	return []byte(strings.Join(out, "\n"))
}

{{/*
Labels on every object's metadata: kustomize's `labels` (app.kubernetes.io/part-of, as
manifests/kustomization.yaml sets it) and, unless rendering that base, Helm's own. Never on
selectors, as with kustomize.
*/}}
{{- define "burnrate.labels" -}}
app.kubernetes.io/part-of: burnrate
{{- if not .Values.kustomizeBase }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}
{{- end }}

{{/* An image reference from (list $ "agent"): by digest when one is given. */}}
{{- define "burnrate.image" -}}
{{- $root := index . 0 -}}
{{- $image := index $root.Values.images (index . 1) -}}
{{- if $image.digest -}}
{{ $image.repository }}@{{ $image.digest }}
{{- else -}}
{{ $image.repository }}:{{ $image.tag | default $root.Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/*
A ConfigMap's name and data, from (dict "name" "data"). The name carries a hash of the data
computed as kustomize's configMapGenerator does, so that the pods reading it roll when it
changes and burnrate-config has the name the kustomization gives it.
*/}}
{{- define "burnrate.configMap" -}}
{{- $hash := dict "kind" "ConfigMap" "name" "" "data" .data | toJson | sha256sum | trunc 10 -}}
{{- /* The letters kustomize puts in place of these hex digits. */ -}}
{{- $suffix := $hash | replace "0" "g" | replace "1" "h" | replace "3" "k" | replace "a" "m" | replace "e" "t" -}}
name: {{ .name }}-{{ $suffix }}
{{- /* JSON, unlike toYaml, keeps a value's final line break through fromYaml. */}}
data: {{ toJson .data }}
{{- end }}

{{/* Where the analyzer and the dashboard find Prometheus. In the kustomize base only the name:
its configMapGenerator makes the ConfigMap and adds the hash to the pods' references. */}}
{{- define "burnrate.config" -}}
{{- if .Values.kustomizeBase -}}
name: burnrate-config
{{- else -}}
{{- $data := dict "prometheus-url" .Values.prometheus.url -}}
{{- include "burnrate.configMap" (dict "name" "burnrate-config" "data" $data) -}}
{{- end -}}
{{- end }}

{{/* The --pricing file, mounted at /etc/burnrate. */}}
{{- define "burnrate.pricing" -}}
{{- $data := dict "pricing.yaml" .Values.pricing -}}
{{- include "burnrate.configMap" (dict "name" "burnrate-pricing" "data" $data) -}}
{{- end }}

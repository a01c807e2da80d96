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

{{/*
--web-config (docs/deploy.md#tls-and-basic-auth), from a part's webConfig values: the file
in its Secret, mounted read-only here. Not under /etc/burnrate, where the analyzer's
--pricing ConfigMap is mounted read-only.
*/}}
{{- define "burnrate.webConfigDir" -}}
/etc/burnrate-web
{{- end }}

{{/* "true" when a part's web-config.yml sets tls_server_config: its probes ask HTTPS (the
kubelet checks no certificate, and /healthz needs no password) and Prometheus scrapes https. */}}
{{- define "burnrate.tls" -}}
{{- if and .secretName .tls }}true{{ end }}
{{- end }}

{{/* How Prometheus reaches a part that serves --web-config: https, trusting the Secret's
ca.crt for serverName, and the user and password of basicAuthSecretName. */}}
{{- define "burnrate.scrapeSecurity" -}}
{{- if include "burnrate.tls" . }}
scheme: https
tlsConfig:
  ca:
    secret:
      name: {{ .secretName }}
      key: ca.crt
  serverName: {{ .serverName }}
{{- end }}
{{- with .basicAuthSecretName }}
basicAuth:
  username:
    name: {{ . }}
    key: username
  password:
    name: {{ . }}
    key: password
{{- end }}
{{- end }}

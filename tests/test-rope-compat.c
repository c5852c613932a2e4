/* Tests of the rope-compat plugin.
 *
 * The plugin's file is included, so its static functions can be called directly.
 * Whole configs are compared byte for byte with tests/data/rope/NAME.FORMAT.json, as
 * JsonGenerator writes them (pretty, indent 2, plus a final newline); small cases are
 * compared in json-glib's compact form.  Every conversion is also run a second time,
 * both on the patched tree and on its re-parsed text, and must not change a byte.
 */
#include "../plugins/rope-compat.c"

#include <stdarg.h>

#include <wsync/registry.h>

/* ------------------------------------------------------------------ helpers */

static char *
read_fixture(const char *name)
{
  g_autofree char *path = g_test_build_filename(G_TEST_DIST, "data", "rope", name, NULL);
  g_autoptr(GError) error = NULL;
  char *text = NULL;

  g_file_get_contents(path, &text, NULL, &error);
  g_assert_no_error(error);
  return text;
}

static JsonNode *
parse(const char *text)
{
  g_autoptr(GError) error = NULL;
  JsonNode *node = json_from_string(text, &error);

  g_assert_no_error(error);
  g_assert_nonnull(node);
  return node;
}

static char *
render(JsonNode *node)
{
  g_autoptr(JsonGenerator) generator = json_generator_new();
  g_autofree char *text = NULL;

  json_generator_set_pretty(generator, TRUE);
  json_generator_set_indent(generator, 2);
  json_generator_set_root(generator, node);
  text = json_generator_to_data(generator, NULL);
  return g_strconcat(text, "\n", NULL);
}

static gboolean
patch(JsonNode *node, RopeFormat format, GError **error)
{
  RopeCompat compat = {format};

  return rope_patch(node, &compat, error);
}

/* Parses @text, patches it and renders the result (pretty, or compact). */
static char *
convert(const char *text, RopeFormat format, gboolean pretty)
{
  g_autoptr(JsonNode) node = parse(text);
  g_autoptr(GError) error = NULL;

  patch(node, format, &error);
  g_assert_no_error(error);
  return pretty ? render(node) : json_to_string(node, FALSE);
}

/* Patching once more, the tree itself and its re-parsed text, changes nothing. */
static void
assert_idempotent(const char *text, RopeFormat format, gboolean pretty)
{
  g_autoptr(JsonNode) node = parse(text);
  g_autofree char *first = NULL, *second = NULL, *reparsed = NULL;
  g_autoptr(GError) error = NULL;

  g_assert_true(patch(node, format, &error));
  first = pretty ? render(node) : json_to_string(node, FALSE);
  g_assert_true(patch(node, format, &error));
  g_assert_no_error(error);
  second = pretty ? render(node) : json_to_string(node, FALSE);
  g_assert_cmpstr(second, ==, first);
  reparsed = convert(first, format, pretty);
  g_assert_cmpstr(reparsed, ==, first);
}

/* Converts fixture @input and compares the result with fixture @expected. */
static void
assert_fixture(const char *input, RopeFormat format, const char *expected)
{
  g_autofree char *text = read_fixture(input);
  g_autofree char *want = read_fixture(expected);
  g_autofree char *got = convert(text, format, TRUE);

  g_assert_cmpstr(got, ==, want);
  assert_idempotent(text, format, TRUE);
}

/* The same for small inline configs, in compact form. */
static void
assert_converts(RopeFormat format, const char *input, const char *expected)
{
  g_autofree char *got = convert(input, format, FALSE);

  g_assert_cmpstr(got, ==, expected);
  assert_idempotent(input, format, FALSE);
}

/* "keep" rewrites nothing but ignore_keys_at_rope_validation: its output is the
 * input as JsonGenerator writes it. */
static void
assert_keep_is_identity(const char *input)
{
  g_autofree char *text = read_fixture(input);
  g_autoptr(JsonNode) node = parse(text);
  g_autofree char *want = render(node);
  g_autofree char *got = convert(text, ROPE_KEEP, TRUE);

  g_assert_cmpstr(got, ==, want);
}

/* The patch fails with a BAD_INPUT error containing each of the NULL-terminated
 * fragments, and leaves the config as it was. */
static void
assert_refused(RopeFormat format, const char *input, ...)
{
  g_autoptr(JsonNode) node = parse(input);
  g_autofree char *before = json_to_string(node, FALSE);
  g_autofree char *after = NULL;
  g_autoptr(GError) error = NULL;
  const char *fragment;
  va_list args;

  g_assert_false(patch(node, format, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
  va_start(args, input);
  while ((fragment = va_arg(args, const char *)) != NULL)
    if (strstr(error->message, fragment) == NULL)
      g_error("message \"%s\" lacks \"%s\"", error->message, fragment);
  va_end(args);
  after = json_to_string(node, FALSE);
  g_assert_cmpstr(after, ==, before);
}

/* ------------------------------------------------------------------ whole configs */

/* Qwen3-30B-A3B: rope_theta 1000000.0 and rope_scaling null become
 * "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"} in their place
 * (docs/hf-checkpoints.md §6, the Qwen3-30B-A3B worked example); transformers4 finds
 * nothing to change. */
static void
test_qwen3_transformers5(void)
{
  g_autofree char *out = read_fixture("qwen3-30b-a3b.transformers5.json");

  assert_fixture("qwen3-30b-a3b.json", ROPE_TRANSFORMERS5, "qwen3-30b-a3b.transformers5.json");
  g_assert_nonnull(strstr(out, "  \"rope_parameters\" : {\n"
                               "    \"rope_theta\" : 1000000.0,\n"
                               "    \"rope_type\" : \"default\"\n"
                               "  },\n"));
  g_assert_null(strstr(out, "\"rope_scaling\""));
  g_assert_null(strstr(out, "\n  \"rope_theta\""));
}

static void
test_qwen3_transformers4(void)
{
  assert_fixture("qwen3-30b-a3b.json", ROPE_TRANSFORMERS4, "qwen3-30b-a3b.transformers4.json");
  assert_keep_is_identity("qwen3-30b-a3b.json");
}

/* Back and forth gives the original, byte for byte. */
static void
test_qwen3_round_trip(void)
{
  g_autofree char *original = read_fixture("qwen3-30b-a3b.json");
  g_autoptr(JsonNode) node = parse(original);
  g_autofree char *want = render(node);

  assert_fixture("qwen3-30b-a3b.transformers5.json", ROPE_TRANSFORMERS4,
                 "qwen3-30b-a3b.transformers4.json");
  assert_fixture("qwen3-30b-a3b.transformers4.json", ROPE_TRANSFORMERS5,
                 "qwen3-30b-a3b.transformers5.json");
  g_autofree char *t4 = read_fixture("qwen3-30b-a3b.transformers4.json");
  g_assert_cmpstr(t4, ==, want);
}

/* YaRN as the Qwen3 README adds it; original_max_position_embeddings is kept. */
static void
test_yarn(void)
{
  assert_fixture("qwen3-30b-a3b-yarn.json", ROPE_TRANSFORMERS5,
                 "qwen3-30b-a3b-yarn.transformers5.json");
  assert_fixture("qwen3-30b-a3b-yarn.json", ROPE_TRANSFORMERS4,
                 "qwen3-30b-a3b-yarn.transformers4.json");
  assert_fixture("qwen3-30b-a3b-yarn.transformers5.json", ROPE_TRANSFORMERS4,
                 "qwen3-30b-a3b-yarn.transformers4.json");
  assert_fixture("qwen3-30b-a3b-yarn.transformers4.json", ROPE_TRANSFORMERS5,
                 "qwen3-30b-a3b-yarn.transformers5.json");
  assert_keep_is_identity("qwen3-30b-a3b-yarn.json");
}

/* Without original_max_position_embeddings it comes from max_position_embeddings,
 * as standardize_rope_params() does for yarn, llama3 and longrope; the legacy "type"
 * turns into "rope_type" in its place. */
static void
test_yarn_fills_original_max(void)
{
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"max_position_embeddings\":131072,"
                  "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4.0},\"rope_theta\":1000000.0}",
                  "{\"max_position_embeddings\":131072,\"rope_parameters\":{\"rope_type\":\"yarn\","
                  "\"factor\":4.0,\"rope_theta\":1000000.0,"
                  "\"original_max_position_embeddings\":131072}}");
  assert_converts(ROPE_TRANSFORMERS4,
                  "{\"max_position_embeddings\":131072,\"rope_parameters\":{\"rope_type\":\"yarn\","
                  "\"factor\":4.0,\"rope_theta\":1000000.0,"
                  "\"original_max_position_embeddings\":131072}}",
                  "{\"max_position_embeddings\":131072,\"rope_scaling\":{\"rope_type\":\"yarn\","
                  "\"factor\":4.0,\"original_max_position_embeddings\":131072},"
                  "\"rope_theta\":1000000.0}");
  /* A top-level one (Phi-3) is used and stays where it is. */
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"original_max_position_embeddings\":4096,\"max_position_embeddings\":131072,"
                  "\"rope_scaling\":{\"type\":\"longrope\",\"long_factor\":[1.0],"
                  "\"short_factor\":[1.0]},\"rope_theta\":10000.0}",
                  "{\"original_max_position_embeddings\":4096,\"max_position_embeddings\":131072,"
                  "\"rope_parameters\":{\"rope_type\":\"longrope\",\"long_factor\":[1.0],"
                  "\"short_factor\":[1.0],\"rope_theta\":10000.0,"
                  "\"original_max_position_embeddings\":4096}}");
}

/* A Transformers-saved (sorted) dict stays sorted: Llama 3.1's llama3 scaling. */
static void
test_sorted_dict(void)
{
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"rope_scaling\":{\"factor\":8.0,\"high_freq_factor\":4.0,"
                  "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,"
                  "\"rope_type\":\"llama3\"},\"rope_theta\":500000.0}",
                  "{\"rope_parameters\":{\"factor\":8.0,\"high_freq_factor\":4.0,"
                  "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,"
                  "\"rope_theta\":500000.0,\"rope_type\":\"llama3\"}}");
}

/* Llama 3.x's llama3 scaling back to Transformers 4: rope_theta leaves the dict for the
 * top level, the four llama3 fields stay in rope_scaling with their rope_type
 * (docs/hf-checkpoints.md §5, §6); without original_max_position_embeddings it is
 * filled from max_position_embeddings, as standardize_rope_params() does for llama3. */
static void
test_llama3(void)
{
  assert_converts(ROPE_TRANSFORMERS4,
                  "{\"rope_parameters\":{\"factor\":32.0,\"high_freq_factor\":4.0,"
                  "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,"
                  "\"rope_theta\":500000.0,\"rope_type\":\"llama3\"},\"tie_word_embeddings\":true}",
                  "{\"rope_scaling\":{\"factor\":32.0,\"high_freq_factor\":4.0,"
                  "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,"
                  "\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,\"tie_word_embeddings\":true}");
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"max_position_embeddings\":131072,\"rope_scaling\":{\"factor\":8.0,"
                  "\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,\"type\":\"llama3\"},"
                  "\"rope_theta\":500000.0}",
                  "{\"max_position_embeddings\":131072,\"rope_parameters\":{\"factor\":8.0,"
                  "\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
                  "\"original_max_position_embeddings\":131072,\"rope_theta\":500000.0,"
                  "\"rope_type\":\"llama3\"}}");
  assert_converts(ROPE_KEEP,
                  "{\"rope_scaling\":{\"factor\":8.0,\"high_freq_factor\":4.0,"
                  "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,"
                  "\"rope_type\":\"llama3\"},\"rope_theta\":500000.0}",
                  "{\"rope_scaling\":{\"factor\":8.0,\"high_freq_factor\":4.0,"
                  "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,"
                  "\"rope_type\":\"llama3\"},\"rope_theta\":500000.0}");
}

/* Qwen3.5: already Transformers 5 style, nested in text_config, with M-RoPE keys.  Back
 * to Transformers 5, the top-level partial_rotary_factor the Transformers 4 form has
 * stays there (hf-qwen.md §4 step 3): the result is the Hub file plus that one line. */
static void
test_qwen35(void)
{
  g_autofree char *t4 = read_fixture("qwen3.5-35b-a3b.transformers4.json");

  assert_fixture("qwen3.5-35b-a3b.json", ROPE_TRANSFORMERS5,
                 "qwen3.5-35b-a3b.transformers5.json");
  assert_fixture("qwen3.5-35b-a3b.json", ROPE_TRANSFORMERS4,
                 "qwen3.5-35b-a3b.transformers4.json");
  assert_fixture("qwen3.5-35b-a3b.transformers4.json", ROPE_TRANSFORMERS5,
                 "qwen3.5-35b-a3b.transformers4.transformers5.json");
  assert_fixture("qwen3.5-35b-a3b.transformers4.transformers5.json", ROPE_TRANSFORMERS4,
                 "qwen3.5-35b-a3b.transformers4.json");
  assert_keep_is_identity("qwen3.5-35b-a3b.json");
  g_assert_nonnull(strstr(t4, "    \"partial_rotary_factor\" : 0.25,\n"));
  g_assert_nonnull(strstr(t4, "    \"rope_scaling\" : {\n"
                              "      \"mrope_interleaved\" : true,\n"
                              "      \"mrope_section\" : [\n"
                              "        11,\n"
                              "        11,\n"
                              "        10\n"
                              "      ],\n"
                              "      \"rope_type\" : \"default\"\n"
                              "    },\n"
                              "    \"rope_theta\" : 10000000,\n"));
}

/* The bundled Qwen3.6-27B config, as Transformers 5 saved it: text_config has
 * partial_rotary_factor both at its top level and in rope_parameters.  transformers5
 * changes nothing; transformers4 leaves the top-level one in place and takes the dict's
 * copy out; and back again gives the file. */
static void
test_qwen36_both_places(void)
{
  g_autofree char *path = g_test_build_filename(G_TEST_DIST, "..", "configs", "qwen3.6-27b.json",
                                                NULL);
  g_autofree char *text = NULL, *want = NULL, *t5 = NULL, *t4 = NULL, *back = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(JsonNode) node = NULL;

  g_file_get_contents(path, &text, NULL, &error);
  g_assert_no_error(error);
  node = parse(text);
  want = render(node);
  t5 = convert(text, ROPE_TRANSFORMERS5, TRUE);
  g_assert_cmpstr(t5, ==, want);
  t4 = convert(text, ROPE_TRANSFORMERS4, TRUE);
  g_assert_nonnull(strstr(t4, "    \"pad_token_id\" : null,\n"
                              "    \"partial_rotary_factor\" : 0.25,\n"
                              "    \"rms_norm_eps\" : 9.9999999999999995e-07,\n"
                              "    \"rope_scaling\" : {\n"
                              "      \"mrope_interleaved\" : true,\n"
                              "      \"mrope_section\" : [\n"
                              "        11,\n"
                              "        11,\n"
                              "        10\n"
                              "      ],\n"
                              "      \"rope_type\" : \"default\"\n"
                              "    },\n"
                              "    \"rope_theta\" : 10000000,\n"
                              "    \"tie_word_embeddings\" : false,\n"));
  g_assert_null(strstr(t4, "rope_parameters"));
  back = convert(t4, ROPE_TRANSFORMERS5, TRUE);
  g_assert_cmpstr(back, ==, want);
  assert_idempotent(text, ROPE_TRANSFORMERS5, TRUE);
  assert_idempotent(text, ROPE_TRANSFORMERS4, TRUE);
}

/* ------------------------------------------------------------------ single rules */

static void
test_ignore_keys_removed(void)
{
  static const char input[] =
      "{\"a\":1,\"ignore_keys_at_rope_validation\":[\"mrope_section\",\"mrope_interleaved\"],"
      "\"text_config\":{\"b\":2,\"ignore_keys_at_rope_validation\":{\"mrope_section\":null},"
      "\"c\":3}}";
  static const char want[] = "{\"a\":1,\"text_config\":{\"b\":2,\"c\":3}}";

  assert_converts(ROPE_KEEP, input, want);
  assert_converts(ROPE_TRANSFORMERS5, input, want);
  assert_converts(ROPE_TRANSFORMERS4, input, want);
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"text_config\":{\"ignore_keys_at_rope_validation\":[\"partial_rotary_factor\"],"
                  "\"rope_theta\":10000000}}",
                  "{\"text_config\":{\"rope_parameters\":{\"rope_theta\":10000000,"
                  "\"rope_type\":\"default\"}}}");
}

/* Unsorted keys: everything else keeps its place; the new keys go where the first RoPE
 * key was; an integer rope_theta stays an integer. */
static void
test_key_order(void)
{
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"z\":1,\"rope_theta\":10000,\"a\":2,\"rope_scaling\":null,\"m\":3}",
                  "{\"z\":1,\"rope_parameters\":{\"rope_theta\":10000,\"rope_type\":\"default\"},"
                  "\"a\":2,\"m\":3}");
  assert_converts(ROPE_TRANSFORMERS4,
                  "{\"z\":1,\"rope_parameters\":{\"rope_theta\":10000,\"rope_type\":\"default\"},"
                  "\"a\":2,\"m\":3}",
                  "{\"z\":1,\"rope_scaling\":null,\"rope_theta\":10000,\"a\":2,\"m\":3}");
  /* Without rope_theta anywhere, Transformers' default_theta, a float. */
  assert_converts(ROPE_TRANSFORMERS5, "{\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2}}",
                  "{\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":2,"
                  "\"rope_theta\":10000.0}}");
}

/* partial_rotary_factor is copied into rope_parameters and stays at the top level too,
 * as Transformers 5 reads it without popping it (hf-qwen.md §4 step 3: "the v5 repr of
 * Qwen3-Next shows it in both places"); back to Transformers 4 only the top-level one is
 * left (Qwen3-Next style). */
static void
test_partial_rotary_factor(void)
{
  static const char next4[] =
      "{\"head_dim\":256,\"partial_rotary_factor\":0.25,\"rms_norm_eps\":1e-06,"
      "\"rope_scaling\":null,\"rope_theta\":10000000,\"vocab_size\":151936}";
  static const char next5[] =
      "{\"head_dim\":256,\"partial_rotary_factor\":0.25,\"rms_norm_eps\":9.9999999999999995e-07,"
      "\"rope_parameters\":{\"partial_rotary_factor\":0.25,\"rope_theta\":10000000,"
      "\"rope_type\":\"default\"},\"vocab_size\":151936}";
  static const char next5_dict_only[] =
      "{\"head_dim\":256,\"rms_norm_eps\":9.9999999999999995e-07,\"rope_parameters\":"
      "{\"partial_rotary_factor\":0.25,\"rope_theta\":10000000,\"rope_type\":\"default\"},"
      "\"vocab_size\":151936}";
  g_autoptr(JsonNode) original = parse(next4);
  g_autofree char *original_text = json_to_string(original, FALSE);

  assert_converts(ROPE_TRANSFORMERS5, next4, next5);
  assert_converts(ROPE_TRANSFORMERS4, next5, original_text);
  /* Only in the dict (Qwen3.5's Hub form): transformers5 adds no top-level key. */
  assert_converts(ROPE_TRANSFORMERS5, next5_dict_only, next5_dict_only);
  /* Sorted config: back at its sorted place, so the round trip is exact. */
  assert_converts(ROPE_TRANSFORMERS4, next5_dict_only, original_text);
  /* Unsorted config: just before rope_scaling. */
  assert_converts(ROPE_TRANSFORMERS4,
                  "{\"b\":1,\"rope_parameters\":{\"rope_type\":\"default\","
                  "\"partial_rotary_factor\":0.5,\"rope_theta\":10000.0},\"a\":0}",
                  "{\"b\":1,\"partial_rotary_factor\":0.5,\"rope_scaling\":null,"
                  "\"rope_theta\":10000.0,\"a\":0}");
  /* In both places with the same value, as Transformers 5 saves it: both stay. */
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"partial_rotary_factor\":0.25,\"rope_parameters\":{\"partial_rotary_factor\":"
                  "0.25,\"rope_theta\":10000000,\"rope_type\":\"default\"}}",
                  "{\"partial_rotary_factor\":0.25,\"rope_parameters\":{\"partial_rotary_factor\":"
                  "0.25,\"rope_theta\":10000000,\"rope_type\":\"default\"}}");
  assert_converts(ROPE_TRANSFORMERS4,
                  "{\"partial_rotary_factor\":0.25,\"rope_parameters\":{\"partial_rotary_factor\":"
                  "0.25,\"rope_theta\":10000000,\"rope_type\":\"default\"}}",
                  "{\"partial_rotary_factor\":0.25,\"rope_scaling\":null,\"rope_theta\":10000000}");
  /* Unsorted, the top-level one keeps its place both ways. */
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"rope_theta\":10000.0,\"z\":1,\"partial_rotary_factor\":0.5,\"a\":2}",
                  "{\"rope_parameters\":{\"partial_rotary_factor\":0.5,\"rope_theta\":10000.0,"
                  "\"rope_type\":\"default\"},\"z\":1,\"partial_rotary_factor\":0.5,\"a\":2}");
  assert_converts(ROPE_TRANSFORMERS4,
                  "{\"rope_parameters\":{\"partial_rotary_factor\":0.5,\"rope_theta\":10000.0,"
                  "\"rope_type\":\"default\"},\"z\":1,\"partial_rotary_factor\":0.5,\"a\":2}",
                  "{\"rope_scaling\":null,\"rope_theta\":10000.0,\"z\":1,"
                  "\"partial_rotary_factor\":0.5,\"a\":2}");
  /* Alone it is no RoPE setting (standardize_rope_params()'s case 0). */
  assert_converts(ROPE_TRANSFORMERS5, "{\"partial_rotary_factor\":0.5}",
                  "{\"partial_rotary_factor\":0.5}");
}

/* Both rope_scaling and rope_parameters: `rope_parameters = rope_scaling or
 * rope_parameters or {}` (hf-qwen.md §4 step 1), so a non-empty rope_scaling is taken
 * whole and every key of rope_parameters is gone, whatever it says; an empty or null
 * rope_scaling leaves rope_parameters in charge. */
static void
test_scaling_wins(void)
{
  static const char both[] =
      "{\"max_position_embeddings\":131072,\"rope_parameters\":{\"rope_type\":\"linear\","
      "\"factor\":4.0,\"mrope_section\":[16,24,24],\"rope_theta\":5000000.0},"
      "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":2.0},\"rope_theta\":1000000.0}";

  assert_converts(ROPE_TRANSFORMERS5, both,
                  "{\"max_position_embeddings\":131072,\"rope_parameters\":{\"rope_type\":\"yarn\","
                  "\"factor\":2.0,\"rope_theta\":1000000.0,"
                  "\"original_max_position_embeddings\":131072}}");
  assert_converts(ROPE_TRANSFORMERS4, both,
                  "{\"max_position_embeddings\":131072,\"rope_scaling\":{\"rope_type\":\"yarn\","
                  "\"factor\":2.0,\"original_max_position_embeddings\":131072},"
                  "\"rope_theta\":1000000.0}");
  /* rope_parameters is not read at all: not even its form is checked. */
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"rope_parameters\":\"nonsense\",\"rope_scaling\":{\"rope_type\":\"linear\","
                  "\"factor\":2.0}}",
                  "{\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":2.0,"
                  "\"rope_theta\":10000.0}}");
  /* {} and null are falsy: rope_parameters is taken. */
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":4.0},"
                  "\"rope_scaling\":{},\"rope_theta\":1000000.0}",
                  "{\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":4.0,"
                  "\"rope_theta\":1000000.0}}");
  assert_converts(ROPE_TRANSFORMERS4,
                  "{\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":4.0},"
                  "\"rope_scaling\":null}",
                  "{\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":4.0},"
                  "\"rope_theta\":10000.0}");
  /* The dict taken is still checked: a wrong rope_scaling is refused, whatever
   * rope_parameters says. */
  assert_refused(ROPE_TRANSFORMERS5,
                 "{\"rope_parameters\":{\"rope_type\":\"default\"},\"rope_scaling\":\"yarn\"}",
                 "rope_scaling must be an object or null, not \"yarn\"", NULL);
}

/* Qwen3.5 and Qwen3-Next default partial_rotary_factor to 0.25 before the conversion
 * (hf-qwen.md §4 step 3), so it goes into the dict when the config has none; other
 * models get none, and no top-level key is made up. */
static void
test_quarter_rotary_default(void)
{
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"model_type\":\"qwen3_next\",\"rope_scaling\":null,\"rope_theta\":10000000}",
                  "{\"model_type\":\"qwen3_next\",\"rope_parameters\":{\"partial_rotary_factor\":"
                  "0.25,\"rope_theta\":10000000,\"rope_type\":\"default\"}}");
  assert_converts(ROPE_TRANSFORMERS4,
                  "{\"model_type\":\"qwen3_next\",\"rope_parameters\":{\"rope_theta\":10000000,"
                  "\"rope_type\":\"default\"}}",
                  "{\"model_type\":\"qwen3_next\",\"partial_rotary_factor\":0.25,"
                  "\"rope_scaling\":null,\"rope_theta\":10000000}");
  /* A Qwen3.5 text_config, named by itself or only by its root. */
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"model_type\":\"qwen3_5_moe\",\"text_config\":{\"rope_parameters\":"
                  "{\"mrope_section\":[11,11,10],\"rope_theta\":10000000,"
                  "\"rope_type\":\"default\"}}}",
                  "{\"model_type\":\"qwen3_5_moe\",\"text_config\":{\"rope_parameters\":"
                  "{\"mrope_section\":[11,11,10],\"partial_rotary_factor\":0.25,"
                  "\"rope_theta\":10000000,\"rope_type\":\"default\"}}}");
  assert_converts(ROPE_TRANSFORMERS4,
                  "{\"text_config\":{\"model_type\":\"qwen3_5_text\",\"rope_parameters\":"
                  "{\"rope_theta\":10000000,\"rope_type\":\"default\"}}}",
                  "{\"text_config\":{\"model_type\":\"qwen3_5_text\",\"partial_rotary_factor\":"
                  "0.25,\"rope_scaling\":null,\"rope_theta\":10000000}}");
  /* A value the config gives is kept. */
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"model_type\":\"qwen3_next\",\"partial_rotary_factor\":0.5,"
                  "\"rope_theta\":1.0}",
                  "{\"model_type\":\"qwen3_next\",\"partial_rotary_factor\":0.5,"
                  "\"rope_parameters\":{\"partial_rotary_factor\":0.5,\"rope_theta\":1.0,"
                  "\"rope_type\":\"default\"}}");
  /* Not Qwen3.5 or Qwen3-Next: nothing added; the Qwen3.5 root itself has no default. */
  assert_converts(ROPE_TRANSFORMERS5, "{\"model_type\":\"qwen3_moe\",\"rope_theta\":1.0}",
                  "{\"model_type\":\"qwen3_moe\",\"rope_parameters\":{\"rope_theta\":1.0,"
                  "\"rope_type\":\"default\"}}");
  assert_converts(ROPE_TRANSFORMERS5, "{\"model_type\":\"qwen3_5\",\"rope_theta\":1.0}",
                  "{\"model_type\":\"qwen3_5\",\"rope_parameters\":{\"rope_theta\":1.0,"
                  "\"rope_type\":\"default\"}}");
}

/* Qwen2-VL's "type": "mrope" is default RoPE, as its Transformers 4 config class says;
 * a re-saved one carries "type": "default" and "rope_type": "default" as well. */
static void
test_legacy_type(void)
{
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"rope_scaling\":{\"type\":\"mrope\",\"mrope_section\":[16,24,24]},"
                  "\"rope_theta\":1000000.0}",
                  "{\"rope_parameters\":{\"rope_type\":\"default\",\"mrope_section\":[16,24,24],"
                  "\"rope_theta\":1000000.0}}");
  assert_converts(ROPE_TRANSFORMERS4,
                  "{\"rope_parameters\":{\"rope_type\":\"default\",\"mrope_section\":[16,24,24],"
                  "\"rope_theta\":1000000.0}}",
                  "{\"rope_scaling\":{\"rope_type\":\"default\",\"mrope_section\":[16,24,24]},"
                  "\"rope_theta\":1000000.0}");
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"rope_scaling\":{\"mrope_section\":[16,24,24],\"rope_type\":\"default\","
                  "\"type\":\"default\"},\"rope_theta\":1000000.0}",
                  "{\"rope_parameters\":{\"mrope_section\":[16,24,24],\"rope_theta\":1000000.0,"
                  "\"rope_type\":\"default\"}}");
  /* A Transformers 4 config stays as it is under transformers4, legacy key included. */
  assert_converts(ROPE_TRANSFORMERS4,
                  "{\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0},\"rope_theta\":10000.0}",
                  "{\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0},\"rope_theta\":10000.0}");
}

/* "su", Phi-3's first name for LongRoPE: vLLM rewrites it to "longrope" for every model
 * (vllm/transformers_utils/config.py:514-516 @ df1376907b16) and accepts "type": "su"
 * beside "rope_type": "longrope" (:496-497); no ROPE_INIT_FUNCTIONS has "su".  Written
 * as "longrope" (with original_max_position_embeddings, as for longrope), not refused:
 * the old tree refused it as an unknown type. */
static void
test_legacy_su(void)
{
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"max_position_embeddings\":131072,\"rope_scaling\":{\"type\":\"su\","
                  "\"long_factor\":[2.0],\"short_factor\":[1.0]},\"rope_theta\":10000.0}",
                  "{\"max_position_embeddings\":131072,\"rope_parameters\":{\"rope_type\":"
                  "\"longrope\",\"long_factor\":[2.0],\"short_factor\":[1.0],\"rope_theta\":"
                  "10000.0,\"original_max_position_embeddings\":131072}}");
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"original_max_position_embeddings\":4096,\"rope_scaling\":{\"long_factor\":"
                  "[2.0],\"rope_type\":\"longrope\",\"short_factor\":[1.0],\"type\":\"su\"}}",
                  "{\"original_max_position_embeddings\":4096,\"rope_parameters\":{"
                  "\"long_factor\":[2.0],\"original_max_position_embeddings\":4096,"
                  "\"rope_theta\":10000.0,\"rope_type\":\"longrope\",\"short_factor\":[1.0]}}");
  assert_converts(ROPE_TRANSFORMERS4,
                  "{\"rope_parameters\":{\"rope_type\":\"su\",\"long_factor\":[2.0],"
                  "\"short_factor\":[1.0],\"original_max_position_embeddings\":4096,"
                  "\"rope_theta\":10000.0}}",
                  "{\"rope_scaling\":{\"rope_type\":\"longrope\",\"long_factor\":[2.0],"
                  "\"short_factor\":[1.0],\"original_max_position_embeddings\":4096},"
                  "\"rope_theta\":10000.0}");
  /* "su" against another type is still a conflict */
  assert_refused(ROPE_TRANSFORMERS5,
                 "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"type\":\"su\",\"factor\":2.0}}",
                 "conflicting RoPE settings: rope_scaling.type is \"su\" but "
                 "rope_scaling.rope_type is \"yarn\"",
                 NULL);
}

/* "proportional" (Gemma 4's p-RoPE) is in Transformers 5's ROPE_INIT_FUNCTIONS and in
 * vLLM's get_rope() (rotary_embedding/__init__.py:144-153 @ df1376907b16), not in
 * Transformers 4's: transformers5 writes it, transformers4 refuses it, naming why.  The
 * old tree refused it in both forms as an unknown type. */
static void
test_proportional(void)
{
  static const char t5[] = "{\"rope_parameters\":{\"partial_rotary_factor\":0.25,"
                           "\"rope_theta\":1000000.0,\"rope_type\":\"proportional\"}}";

  assert_converts(ROPE_TRANSFORMERS5, t5, t5);
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"rope_scaling\":{\"rope_type\":\"proportional\"},\"rope_theta\":1000000.0}",
                  "{\"rope_parameters\":{\"rope_theta\":1000000.0,\"rope_type\":"
                  "\"proportional\"}}");
  assert_refused(ROPE_TRANSFORMERS4, t5,
                 "rope_parameters.rope_type: RoPE type \"proportional\" is Transformers 5's (and "
                 "vLLM's); Transformers 4 has none, so rope-format transformers4 cannot write it",
                 NULL);
}

/* Both levels are converted; objects without RoPE keys are left alone. */
static void
test_levels(void)
{
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"rope_theta\":1.5,\"text_config\":{\"rope_theta\":2},\"vision_config\":"
                  "{\"rope_theta\":3}}",
                  "{\"rope_parameters\":{\"rope_theta\":1.5,\"rope_type\":\"default\"},"
                  "\"text_config\":{\"rope_parameters\":{\"rope_theta\":2,\"rope_type\":"
                  "\"default\"}},\"vision_config\":{\"rope_theta\":3}}");
  assert_converts(ROPE_TRANSFORMERS5, "{\"hidden_size\":8,\"text_config\":[]}",
                  "{\"hidden_size\":8,\"text_config\":[]}");
  assert_converts(ROPE_TRANSFORMERS4, "{\"hidden_size\":8}", "{\"hidden_size\":8}");
}

/* rope_parameters keyed by layer type (Gemma3) has no Transformers 4 form. */
static void
test_per_layer_type(void)
{
  static const char gemma[] =
      "{\"rope_parameters\":{\"full_attention\":{\"rope_theta\":1000000.0,\"rope_type\":"
      "\"default\"},\"sliding_attention\":{\"rope_theta\":10000.0,\"rope_type\":\"default\"}}}";

  assert_converts(ROPE_TRANSFORMERS5, gemma, gemma);
  assert_refused(ROPE_TRANSFORMERS4, gemma, "rope_parameters is keyed by layer type", NULL);
  /* A non-empty rope_scaling replaces it like any other rope_parameters. */
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"default\"}},"
                  "\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2.0}}",
                  "{\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":2.0,"
                  "\"rope_theta\":10000.0}}");
}

/* ------------------------------------------------------------------ errors */

static void
test_unknown_type(void)
{
  assert_refused(ROPE_TRANSFORMERS5,
                 "{\"rope_scaling\":{\"rope_type\":\"foo\",\"factor\":2.0},\"rope_theta\":1.0}",
                 "rope_scaling.rope_type", "unknown RoPE type \"foo\"", NULL);
  assert_refused(ROPE_TRANSFORMERS4,
                 "{\"text_config\":{\"rope_parameters\":{\"rope_type\":\"foo\"}}}",
                 "text_config.rope_parameters.rope_type", "\"foo\"", NULL);
  assert_refused(ROPE_TRANSFORMERS5, "{\"rope_scaling\":{\"type\":7}}",
                 "rope_scaling.type must be a string, not 7", NULL);
  /* keep checks nothing. */
  assert_converts(ROPE_KEEP, "{\"rope_scaling\":{\"rope_type\":\"foo\"}}",
                  "{\"rope_scaling\":{\"rope_type\":\"foo\"}}");
}

static void
test_conflicts(void)
{
  assert_refused(ROPE_TRANSFORMERS5,
                 "{\"rope_parameters\":{\"rope_theta\":10000000,\"rope_type\":\"default\"},"
                 "\"rope_theta\":1000000.0}",
                 "conflicting RoPE settings: rope_theta is 1000000.0 but "
                 "rope_parameters.rope_theta is 10000000",
                 NULL);
  assert_refused(ROPE_TRANSFORMERS4,
                 "{\"text_config\":{\"rope_theta\":1.0,\"rope_parameters\":{\"rope_theta\":2.0}}}",
                 "text_config.rope_theta is 1.0 but text_config.rope_parameters.rope_theta is 2.0",
                 NULL);
  assert_refused(ROPE_TRANSFORMERS5,
                 "{\"rope_scaling\":{\"type\":\"linear\",\"rope_type\":\"yarn\",\"factor\":2.0}}",
                 "rope_scaling.type is \"linear\" but rope_scaling.rope_type is \"yarn\"", NULL);
  assert_refused(ROPE_TRANSFORMERS4,
                 "{\"partial_rotary_factor\":0.5,\"rope_parameters\":{\"partial_rotary_factor\":"
                 "0.25}}",
                 "partial_rotary_factor is 0.5 but rope_parameters.partial_rotary_factor is 0.25",
                 NULL);
  assert_refused(ROPE_TRANSFORMERS5,
                 "{\"partial_rotary_factor\":0.5,\"rope_parameters\":{\"partial_rotary_factor\":"
                 "0.25}}",
                 "partial_rotary_factor is 0.5 but rope_parameters.partial_rotary_factor is 0.25",
                 NULL);
  /* Equal numbers written differently are no conflict. */
  assert_converts(ROPE_TRANSFORMERS5,
                  "{\"rope_theta\":1000000,\"rope_parameters\":{\"rope_theta\":1000000.0}}",
                  "{\"rope_parameters\":{\"rope_theta\":1000000.0,\"rope_type\":\"default\"}}");
}

static void
test_malformed(void)
{
  assert_refused(ROPE_TRANSFORMERS5, "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0}}",
                 "rope_scaling: rope_type \"yarn\" needs original_max_position_embeddings",
                 "max_position_embeddings", NULL);
  assert_refused(ROPE_TRANSFORMERS5, "{\"text_config\":{\"rope_scaling\":\"yarn\"}}",
                 "text_config.rope_scaling must be an object or null, not \"yarn\"", NULL);
  assert_refused(ROPE_TRANSFORMERS5, "{\"rope_theta\":\"1e6\"}",
                 "rope_theta must be a number, not \"1e6\"", NULL);
}

/* A config refused because of text_config is left whole, top level included. */
static void
test_refused_config_untouched(void)
{
  assert_refused(ROPE_TRANSFORMERS5,
                 "{\"ignore_keys_at_rope_validation\":[],\"rope_theta\":1.0,"
                 "\"text_config\":{\"rope_scaling\":{\"rope_type\":\"foo\"}}}",
                 "text_config.rope_scaling.rope_type", NULL);
}

static void
test_not_an_object(void)
{
  g_autoptr(JsonNode) node = parse("[1]");
  g_autoptr(GError) error = NULL;

  g_assert_false(patch(node, ROPE_TRANSFORMERS5, &error));
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_BAD_INPUT);
}

/* ------------------------------------------------------------------ the option */

static GString *confuse_message;

static void
collect_confuse_error(cfg_t *cfg, const char *fmt, va_list args)
{
  (void)cfg;
  g_string_append_vprintf(confuse_message, fmt, args);
}

/* Parses @text against the plugin's own option table. */
static int
parse_options(const char *text, char **value)
{
  cfg_t *cfg = cfg_init(options, CFGF_NONE);
  int rc;

  g_string_truncate(confuse_message, 0);
  cfg_set_error_function(cfg, collect_confuse_error);
  rc = cfg_parse_buf(cfg, text);
  *value = rc == CFG_SUCCESS ? g_strdup(cfg_getstr(cfg, "rope-format")) : NULL;
  cfg_free(cfg);
  return rc;
}

static void
test_option_validator(void)
{
  static const char *const good[] = {"transformers5", "transformers4", "keep"};
  g_autofree char *value = NULL;

  confuse_message = g_string_new(NULL);
  g_assert_cmpint(parse_options("rope-format = \"bogus\"\n", &value), ==, CFG_PARSE_ERROR);
  g_assert_nonnull(strstr(confuse_message->str, "rope-format must be transformers5, "
                                                "transformers4 or keep, not \"bogus\""));
  for (guint i = 0; i < G_N_ELEMENTS(good); i++) {
    g_autofree char *text = g_strdup_printf("rope-format = \"%s\"\n", good[i]);
    g_clear_pointer(&value, g_free);
    g_assert_cmpint(parse_options(text, &value), ==, CFG_SUCCESS);
    g_assert_cmpstr(value, ==, good[i]);
  }
  g_clear_pointer(&value, g_free);
  g_assert_cmpint(parse_options("", &value), ==, CFG_SUCCESS);
  g_assert_cmpstr(value, ==, "keep");
  g_string_free(confuse_message, TRUE);
}

/* ------------------------------------------------------------------ through the core */

/* Loads the built rope-compat.so with @overrides as the configuration. */
static WsyncContext *
load_built_plugin(const char *overrides, GError **error)
{
  const char *dir = g_getenv("WSYNC_TEST_BUILT_PLUGIN_DIR");
  const char *dirs[] = {dir, NULL};

  return wsync_context_new(NULL, dirs, overrides, error);
}

static gboolean
have_built_plugin(void)
{
  const char *dir = g_getenv("WSYNC_TEST_BUILT_PLUGIN_DIR");
  g_autofree char *path = dir ? g_build_filename(dir, "rope-compat.so", NULL) : NULL;

  if (path != NULL && g_file_test(path, G_FILE_TEST_EXISTS))
    return TRUE;
  g_test_skip("WSYNC_TEST_BUILT_PLUGIN_DIR has no rope-compat.so");
  return FALSE;
}

static void
test_registered_patcher(void)
{
  g_autoptr(GError) error = NULL;
  WsyncContext *ctx;
  g_autoptr(GPtrArray) entries = NULL;
  WsyncConfigPatchFunc func;
  g_autofree char *text = NULL, *want = NULL, *got = NULL;
  g_autoptr(JsonNode) node = NULL;

  if (!have_built_plugin())
    return;
  ctx = load_built_plugin("plugin \"rope-compat\" {\n  rope-format = \"transformers5\"\n}\n",
                          &error);
  g_assert_no_error(error);
  entries = wsync_registry_lookup(wsync_context_get_registry(ctx), WSYNC_ENTRY_CONFIG_PATCHER,
                                  NULL);
  g_assert_cmpuint(entries->len, ==, 1);
  g_assert_cmpstr(wsync_entry_get_name(entries->pdata[0]), ==, "rope-compat");
  g_assert_cmpstr(wsync_entry_get_plugin(entries->pdata[0]), ==, "rope-compat");
  func = (WsyncConfigPatchFunc)wsync_entry_get_callback(entries->pdata[0]);
  text = read_fixture("qwen3-30b-a3b.json");
  want = read_fixture("qwen3-30b-a3b.transformers5.json");
  node = parse(text);
  g_assert_true(func(node, wsync_entry_get_user_data(entries->pdata[0]), &error));
  g_assert_no_error(error);
  got = render(node);
  g_assert_cmpstr(got, ==, want);
  g_clear_pointer(&entries, g_ptr_array_unref);
  wsync_context_free(ctx);
}

static void
test_registered_bad_option(void)
{
  g_autoptr(GError) error = NULL;
  WsyncContext *ctx;

  if (!have_built_plugin())
    return;
  ctx = load_built_plugin("plugin \"rope-compat\" {\n  rope-format = \"bogus\"\n}\n", &error);
  g_assert_null(ctx);
  g_assert_error(error, WSYNC_ERROR, WSYNC_ERROR_CONFIG);
  g_assert_nonnull(strstr(error->message, "command line:2"));
  g_assert_nonnull(strstr(error->message, "rope-format must be transformers5, transformers4 or "
                                          "keep, not \"bogus\""));
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);

  g_test_add_func("/rope-compat/qwen3-30b/transformers5", test_qwen3_transformers5);
  g_test_add_func("/rope-compat/qwen3-30b/transformers4", test_qwen3_transformers4);
  g_test_add_func("/rope-compat/qwen3-30b/round-trip", test_qwen3_round_trip);
  g_test_add_func("/rope-compat/yarn/both-ways", test_yarn);
  g_test_add_func("/rope-compat/yarn/fills-original-max", test_yarn_fills_original_max);
  g_test_add_func("/rope-compat/sorted-dict", test_sorted_dict);
  g_test_add_func("/rope-compat/llama3", test_llama3);
  g_test_add_func("/rope-compat/qwen3.5/nested", test_qwen35);
  g_test_add_func("/rope-compat/qwen3.6/both-places", test_qwen36_both_places);
  g_test_add_func("/rope-compat/ignore-keys-removed", test_ignore_keys_removed);
  g_test_add_func("/rope-compat/key-order", test_key_order);
  g_test_add_func("/rope-compat/partial-rotary-factor", test_partial_rotary_factor);
  g_test_add_func("/rope-compat/partial-rotary-factor/qwen-default", test_quarter_rotary_default);
  g_test_add_func("/rope-compat/scaling-wins", test_scaling_wins);
  g_test_add_func("/rope-compat/legacy-type", test_legacy_type);
  g_test_add_func("/rope-compat/legacy-su", test_legacy_su);
  g_test_add_func("/rope-compat/proportional", test_proportional);
  g_test_add_func("/rope-compat/levels", test_levels);
  g_test_add_func("/rope-compat/per-layer-type", test_per_layer_type);
  g_test_add_func("/rope-compat/error/unknown-type", test_unknown_type);
  g_test_add_func("/rope-compat/error/conflicts", test_conflicts);
  g_test_add_func("/rope-compat/error/malformed", test_malformed);
  g_test_add_func("/rope-compat/error/config-untouched", test_refused_config_untouched);
  g_test_add_func("/rope-compat/error/not-an-object", test_not_an_object);
  g_test_add_func("/rope-compat/option/validator", test_option_validator);
  g_test_add_func("/rope-compat/option/registered-patcher", test_registered_patcher);
  g_test_add_func("/rope-compat/option/registered-bad-option", test_registered_bad_option);
  return g_test_run();
}

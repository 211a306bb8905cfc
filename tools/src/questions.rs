//! The questions the benchmarks ask: realistic, short, English and French, each asked once per
//! run. A repeated question would be measured from the prefix cache (the whole question already
//! in the context), not from the traffic a user makes; a seeded shuffle keeps runs comparable.

/// 64 questions; a run takes them in the order of `shuffled(seed)` and never asks one twice.
pub const QUESTIONS: &[&str] = &[
    "What is the capital of France? Answer in one short sentence.",
    "Give me one tip for sleeping better.",
    "Explain in two sentences why the sky is blue.",
    "Quelle est la capitale de l'Italie ?",
    "Name a healthy breakfast.",
    "How long should I boil an egg for a soft yolk?",
    "What is a good way to start learning the guitar?",
    "Why do cats purr?",
    "Comment faire une pâte à crêpes simple ?",
    "How many planets are in the solar system?",
    "What should I pack for a weekend in the mountains?",
    "Quel temps fait-il généralement à Nice en avril ?",
    "Suggest a name for a small grey kitten.",
    "How do I remove a coffee stain from a shirt?",
    "What is the difference between weather and climate?",
    "Peux-tu me conseiller un livre pour les vacances ?",
    "How can I make my tomato plants grow better?",
    "Why is the sea salty?",
    "Comment dit-on « merci beaucoup » en espagnol ?",
    "What is a quick dinner I can cook in fifteen minutes?",
    "How do bees make honey?",
    "Give me three words that rhyme with light.",
    "Qu'est-ce qu'un trou noir, en deux phrases ?",
    "How often should I water a cactus?",
    "What is the tallest mountain in Europe?",
    "Explain what a rainbow is to a six-year-old.",
    "Combien de temps faut-il pour cuire des pâtes ?",
    "What are the rules of tic-tac-toe?",
    "How do I stay focused while working from home?",
    "Why do leaves change colour in autumn?",
    "Quelle est la différence entre un crocodile et un alligator ?",
    "What is a polite way to decline an invitation?",
    "How does a bicycle stay upright?",
    "Name two famous paintings by Claude Monet.",
    "Comment garder le pain frais plus longtemps ?",
    "What is the best time of day to go for a run?",
    "How do I write a short thank-you note to a teacher?",
    "Why do we have leap years?",
    "Que puis-je faire à Lyon un dimanche ?",
    "What does a good morning routine look like?",
    "How far is the Moon from the Earth?",
    "Suggest a game to play with four friends on a rainy day.",
    "Pourquoi la Tour Eiffel a-t-elle été construite ?",
    "How do I calm down before a job interview?",
    "What is the boiling point of water at sea level?",
    "Give me a simple recipe for lemonade.",
    "Comment apprendre une langue plus vite ?",
    "What are the primary colours?",
    "How can I save a little money every month?",
    "Why does bread rise in the oven?",
    "Quels fruits sont de saison en été ?",
    "What is a haiku? Give a short example.",
    "How do I tell if a melon is ripe?",
    "What language is spoken in Brazil?",
    "Comment expliquer la photosynthèse simplement ?",
    "How long does it take to walk five kilometres?",
    "What is the difference between a lake and a pond?",
    "Give me one idea for a birthday present for my grandmother.",
    "Pourquoi le ciel est-il rouge au coucher du soleil ?",
    "How do I keep a houseplant alive while I travel?",
    "What is the speed of sound in air?",
    "Recommend a calm piece of classical music.",
    "Quelle est la plus longue rivière de France ?",
    "How do I fold a paper airplane that flies far?",
];

/// Every question once, in an order fixed by `seed`.
pub fn shuffled(seed: u64) -> Vec<&'static str> {
    let mut q = QUESTIONS.to_vec();
    fastrand::Rng::with_seed(seed).shuffle(&mut q);
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_question_twice_and_the_order_is_the_seeds() {
        let mut q = QUESTIONS.to_vec();
        q.sort_unstable();
        q.dedup();
        assert_eq!(q.len(), QUESTIONS.len(), "a question appears twice");
        assert_eq!(shuffled(7), shuffled(7));
        assert_ne!(shuffled(7), shuffled(8));
    }
}
